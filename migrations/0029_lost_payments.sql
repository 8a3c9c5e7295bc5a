-- capvend ledger, schema 29: payments capvend made and a restored ledger
-- lost (issue 30, the disaster drill).
--
-- A ledger restored from its replica misses what happened after the last
-- replicated change: an invoice quoted then and paid is money LND holds
-- that no payment row names. capvend makes the preimage of every LND
-- invoice (plain and hold) carry a mark keyed by this ledger's identity
-- (billing/lnd: a nonce and its HMAC); the identity is made once, here,
-- and travels with every backup and replica of the ledger. Reconciliation
-- recognizes a settled invoice whose preimage carries the mark and that
-- no payment names, and books it once: a row here with the adjustment
-- entry that moved its amount to liabilities:unattributed (received for a
-- call the ledger lost; the operator returns it or books it as income).
-- The Cashu wallet keeps its own store of the mint quotes it requested,
-- beside the ledger: a quote of it that no payment names, paid at the
-- mint, is minted and booked the same way (backend 'cashu', its mint).
CREATE TABLE ledger_identity (
	id   INTEGER PRIMARY KEY CHECK (id = 1),
	mark BLOB    NOT NULL CHECK (length(mark) = 32)
);
INSERT INTO ledger_identity (id, mark) VALUES (1, randomblob(32));

CREATE TRIGGER ledger_identity_immutable
BEFORE UPDATE ON ledger_identity
BEGIN
	SELECT RAISE(ABORT, 'capvend: the ledger identity never changes');
END;

CREATE TRIGGER ledger_identity_no_delete
BEFORE DELETE ON ledger_identity
BEGIN
	SELECT RAISE(ABORT, 'capvend: the ledger identity never changes');
END;

CREATE TABLE lost_payments (
	ref         TEXT    PRIMARY KEY CHECK (ref <> ''),
	backend     TEXT    NOT NULL CHECK (backend IN ('lnd', 'cashu')),
	mint_url    TEXT    NOT NULL DEFAULT '' CHECK ((backend = 'cashu') = (mint_url <> '')),
	account     TEXT    NOT NULL CHECK (account LIKE 'assets:%'), -- where the money landed
	amount_msat INTEGER NOT NULL CHECK (amount_msat > 0),
	entry_id    INTEGER NOT NULL UNIQUE REFERENCES entries (id),
	found_at    INTEGER NOT NULL
);

CREATE TRIGGER lost_payments_immutable
BEFORE UPDATE ON lost_payments
BEGIN
	SELECT RAISE(ABORT, 'capvend: a lost payment, once booked, is immutable');
END;

CREATE TRIGGER lost_payments_no_delete
BEFORE DELETE ON lost_payments
BEGIN
	SELECT RAISE(ABORT, 'capvend: a lost payment, once booked, is immutable');
END;
