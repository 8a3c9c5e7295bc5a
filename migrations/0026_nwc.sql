-- capvend ledger, schema 26: payments into a wallet reached by Nostr
-- Wallet Connect (NIP-47, billing/nwc; issue 28).
--
-- A payment's backend may now be an NWC connection: 'nwc', or
-- 'nwc:<name>' for one of several connections (lower-case letters,
-- digits, '_' and '-'). Each connection watches only its own payments
-- (UnsettledPayments by backend), so the name is part of the payment.
--
-- A payment's kind may now be 'wallet_invoice': a plain invoice made by
-- the wallet (make_invoice) that capvend cannot withdraw, since NIP-47
-- has no method to cancel a plain invoice. It stays payable at the wallet
-- after capvend canceled or expired it, so money that arrives late is
-- booked and owed back, as for a mint quote (vend.LatePayable). A hold
-- invoice made through NWC is a 'hold_invoice', canceled through the
-- wallet like LND's.
--
-- payments is rebuilt to widen its CHECKs; its rows and ids are kept. The
-- tables that reference it keep their rows: the foreign keys are checked
-- once, at commit, when every payment is back under its id.
PRAGMA defer_foreign_keys = ON;

CREATE TEMP TABLE payments_v25 AS SELECT * FROM payments;
DROP TABLE payments;

CREATE TABLE payments (
	id             INTEGER PRIMARY KEY,
	backend        TEXT    NOT NULL CHECK (backend IN ('lnd', 'cashu', 'nwc')
		OR (backend GLOB 'nwc:?*' AND backend NOT GLOB 'nwc:*[^a-z0-9_-]*' AND length(backend) <= 68)),
	kind           TEXT    NOT NULL CHECK (kind IN ('invoice', 'hold_invoice', 'mint_quote', 'token', 'wallet_invoice')),
	ref            TEXT    NOT NULL UNIQUE CHECK (ref <> ''),
	call_id        INTEGER NOT NULL REFERENCES calls (id),
	bolt11         TEXT    NOT NULL DEFAULT '',
	mint_url       TEXT    NOT NULL DEFAULT '',
	amount_msat    INTEGER NOT NULL CHECK (amount_msat > 0),
	state          TEXT    NOT NULL DEFAULT 'open' CHECK (state IN (
		'open', 'accepted', 'settled', 'canceled', 'expired')),
	expires_at     INTEGER NOT NULL,
	created_at     INTEGER NOT NULL,
	updated_at     INTEGER NOT NULL,
	settled_at     INTEGER,
	settled_msat   INTEGER CHECK (settled_msat IS NULL OR settled_msat > 0),
	fee_msat       INTEGER NOT NULL DEFAULT 0 CHECK (fee_msat >= 0),
	-- LND invoice indexes seen for this invoice (0 = not seen).
	add_index      INTEGER NOT NULL DEFAULT 0,
	settle_index   INTEGER NOT NULL DEFAULT 0,
	CHECK ((state = 'settled') = (settled_at IS NOT NULL AND settled_msat IS NOT NULL)),
	-- An NWC connection's payments are its invoices: plain (wallet) or hold.
	CHECK (backend NOT GLOB 'nwc*' OR kind IN ('wallet_invoice', 'hold_invoice')),
	CHECK (kind <> 'wallet_invoice' OR backend GLOB 'nwc*')
);

INSERT INTO payments SELECT * FROM payments_v25;
DROP TABLE payments_v25;

CREATE INDEX payments_call ON payments (call_id);
CREATE INDEX payments_state ON payments (state, expires_at);

CREATE TRIGGER payments_state_machine
BEFORE UPDATE OF state ON payments
WHEN NEW.state <> OLD.state AND NOT EXISTS (
	SELECT 1 FROM payment_transitions WHERE from_state = OLD.state AND to_state = NEW.state)
BEGIN
	SELECT RAISE(ABORT, 'capvend: illegal payment state transition');
END;

CREATE TRIGGER payments_identity_immutable
BEFORE UPDATE OF backend, kind, ref, call_id, bolt11, amount_msat, created_at ON payments
BEGIN
	SELECT RAISE(ABORT, 'capvend: a payment''s identity and amount are immutable');
END;

CREATE TRIGGER payments_no_delete
BEFORE DELETE ON payments
BEGIN
	SELECT RAISE(ABORT, 'capvend: payments are never deleted');
END;

-- A reconciliation's differences name NWC connections too. Nothing
-- references the table: rebuilt the same way, with its triggers.
DROP TRIGGER reconcile_differences_immutable;
DROP TRIGGER reconcile_differences_append_only;
DROP INDEX reconcile_differences_run;

CREATE TABLE reconcile_differences_v26 (
	id        INTEGER PRIMARY KEY,
	run_id    INTEGER NOT NULL REFERENCES reconcile_runs (id),
	kind      TEXT    NOT NULL CHECK (kind IN (
		'settled_unbooked', 'booked_unsettled', 'canceled_unbooked', 'orphan_hold',
		'cashu_balance', 'mint_quote')),
	backend   TEXT    NOT NULL CHECK (backend IN ('lnd', 'cashu', 'nwc')
		OR (backend GLOB 'nwc:?*' AND backend NOT GLOB 'nwc:*[^a-z0-9_-]*' AND length(backend) <= 68)),
	ref       TEXT    NOT NULL DEFAULT '',
	call_id   INTEGER REFERENCES calls (id),
	mint_url  TEXT    NOT NULL DEFAULT '',
	ledger    TEXT    NOT NULL DEFAULT '', -- what the ledger says
	remote    TEXT    NOT NULL DEFAULT '', -- what LND, the wallet or the mint says
	detail    TEXT    NOT NULL DEFAULT '',
	-- What the reconciler did about it, '' if it is left to the operator.
	repair    TEXT    NOT NULL DEFAULT '',
	found_at  INTEGER NOT NULL
);
INSERT INTO reconcile_differences_v26 SELECT * FROM reconcile_differences;
DROP TABLE reconcile_differences;
ALTER TABLE reconcile_differences_v26 RENAME TO reconcile_differences;
CREATE INDEX reconcile_differences_run ON reconcile_differences (run_id);

CREATE TRIGGER reconcile_differences_immutable
BEFORE UPDATE ON reconcile_differences
BEGIN
	SELECT RAISE(ABORT, 'capvend: reconciliation differences are immutable');
END;

CREATE TRIGGER reconcile_differences_append_only
BEFORE DELETE ON reconcile_differences
BEGIN
	SELECT RAISE(ABORT, 'capvend: reconciliation differences are append-only');
END;
