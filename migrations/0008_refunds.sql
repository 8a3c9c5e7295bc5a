-- capvend ledger, schema 8: refunds are money, and Cashu swaps are recorded
-- before they happen.
--
-- 1. The client's refund invoice. A client may give, with a priced call, a
--    bolt11 invoice to be refunded to (_meta "capvend/refund_invoice"). It
--    is kept with the call, written once.
ALTER TABLE calls ADD COLUMN refund_invoice TEXT NOT NULL DEFAULT ''
	CHECK (length(refund_invoice) <= 2048);

CREATE TRIGGER calls_refund_invoice_immutable
BEFORE UPDATE OF refund_invoice ON calls
BEGIN
	SELECT RAISE(ABORT, 'capvend: a call''s refund invoice is immutable');
END;

-- 2. Refunds. Every refund entry of a call (its income moved to
--    liabilities:refunds) comes with one row here, written in the same
--    transaction: what is owed, to whom, for which call and payment. A
--    refund is paid out once: owed -> paid is its only move, it then
--    names the one sealed journal entry that took its amount out of
--    liabilities:refunds, and nothing about it changes again. The sum of
--    the owed refunds is the balance of liabilities:refunds (ledger
--    verify checks it).
CREATE TABLE refunds (
	id          INTEGER PRIMARY KEY,
	call_id     INTEGER NOT NULL UNIQUE REFERENCES calls (id),
	payment_id  INTEGER NOT NULL UNIQUE REFERENCES payments (id),
	transport   TEXT    NOT NULL CHECK (transport <> ''),
	client      TEXT    NOT NULL CHECK (client <> ''),
	amount_msat INTEGER NOT NULL CHECK (amount_msat > 0),
	invoice     TEXT    NOT NULL DEFAULT '', -- the client's refund bolt11, if it gave one
	reason      TEXT    NOT NULL DEFAULT '',
	state       TEXT    NOT NULL DEFAULT 'owed' CHECK (state IN ('owed', 'paid')),
	created_at  INTEGER NOT NULL,
	-- The payout, written once with state 'paid'.
	paid_at     INTEGER,
	method      TEXT    CHECK (method IN ('cashu', 'bolt11')),
	paid_msat   INTEGER CHECK (paid_msat > 0),  -- what the client got
	fee_msat    INTEGER CHECK (fee_msat >= 0),  -- what paying it cost beyond that
	mint_url    TEXT,                           -- the mint whose ecash paid it
	token       TEXT,                           -- a Cashu payout: the token (bearer: never exported)
	payout_ref  TEXT,                           -- a bolt11 payout: the melt quote id
	entry_id    INTEGER UNIQUE REFERENCES entries (id),
	CHECK ((state = 'paid') = (paid_at IS NOT NULL AND method IS NOT NULL AND paid_msat IS NOT NULL
		AND fee_msat IS NOT NULL AND mint_url IS NOT NULL AND entry_id IS NOT NULL)),
	CHECK (method IS NOT 'cashu' OR coalesce(token, '') <> ''),
	-- Never more than owed (a token may round it up to the next sat).
	CHECK (paid_msat IS NULL OR paid_msat <= (amount_msat + 999) / 1000 * 1000)
);
CREATE INDEX refunds_state ON refunds (state);

-- A refund row is written with the refund entry of its call and payment.
CREATE TRIGGER refunds_need_refund_entry
BEFORE INSERT ON refunds
WHEN NEW.state <> 'owed' OR NOT EXISTS (SELECT 1 FROM entries e
	WHERE e.call_id = NEW.call_id AND e.payment_id = NEW.payment_id AND e.kind = 'refund' AND e.sealed = 1)
BEGIN
	SELECT RAISE(ABORT, 'capvend: a refund is written owed, with its call''s refund entry');
END;

-- owed -> paid, once; who, what and how much never change.
CREATE TRIGGER refunds_paid_once
BEFORE UPDATE ON refunds
WHEN NOT (OLD.state = 'owed' AND NEW.state = 'paid'
	AND NEW.id = OLD.id AND NEW.call_id = OLD.call_id AND NEW.payment_id = OLD.payment_id
	AND NEW.transport = OLD.transport AND NEW.client = OLD.client AND NEW.amount_msat = OLD.amount_msat
	AND NEW.invoice = OLD.invoice AND NEW.reason = OLD.reason AND NEW.created_at = OLD.created_at)
BEGIN
	SELECT RAISE(ABORT, 'capvend: a refund is paid once; then it never changes');
END;

-- The payout is a sealed refund entry that takes exactly the refund's
-- amount out of liabilities:refunds.
CREATE TRIGGER refunds_payout_entry
BEFORE UPDATE OF state ON refunds
WHEN NEW.state = 'paid' AND NOT EXISTS (SELECT 1 FROM entries e
	JOIN postings p ON p.entry_id = e.id JOIN accounts a ON a.id = p.account_id
	WHERE e.id = NEW.entry_id AND e.kind = 'refund' AND e.sealed = 1 AND e.call_id IS NULL
		AND a.name = 'liabilities:refunds' AND p.amount_msat = NEW.amount_msat)
BEGIN
	SELECT RAISE(ABORT, 'capvend: a paid refund needs its payout entry');
END;

CREATE TRIGGER refunds_no_delete
BEFORE DELETE ON refunds
BEGIN
	SELECT RAISE(ABORT, 'capvend: refunds are never deleted');
END;

-- Refunds booked before this schema are owed (nothing ever paid them).
INSERT INTO refunds (call_id, payment_id, transport, client, amount_msat, reason, state, created_at)
SELECT c.id, e.payment_id, c.transport, c.client,
	-(SELECT sum(p.amount_msat) FROM postings p JOIN accounts a ON a.id = p.account_id
		WHERE p.entry_id = e.id AND a.name = 'liabilities:refunds'),
	c.reason, 'owed', e.ts
FROM entries e JOIN calls c ON c.id = e.call_id
WHERE e.kind = 'refund' AND e.sealed = 1 AND e.payment_id IS NOT NULL;

-- 3. Cashu proofs are recorded 'swapping' before capvend asks the mint to
--    swap them, in the same transaction as their payment; the settlement
--    moves them to 'swapped'. A crash or a lost answer in between leaves
--    them 'swapping': at the next start (or when the same token comes
--    again) the mint's proof state (NUT-07) decides: unspent, the swap
--    never happened and they are 'released' (the client's token is still
--    good and may pay again); spent, the swap happened and the settlement
--    is booked. 'spent' and 'rejected' are proofs the mint refused. Rows
--    of a 'released' swap do not block the same secret being received
--    again: the secret is unique among the other rows only. y is the
--    proof's hash_to_curve(secret) (hex), what NUT-07 asks by: public,
--    unlike the secret, which is never stored.
--
--    The table is rebuilt to widen its state CHECK; its rows are kept.
DROP TRIGGER cashu_proofs_identity_immutable;
DROP TRIGGER cashu_proofs_no_delete;

CREATE TABLE cashu_proofs_v8 (
	id          INTEGER PRIMARY KEY,
	secret_hash TEXT    NOT NULL CHECK (length(secret_hash) = 64),
	y           TEXT    CHECK (y IS NULL OR length(y) = 66),
	amount_sat  INTEGER NOT NULL CHECK (amount_sat > 0),
	keyset_id   TEXT    NOT NULL CHECK (keyset_id <> ''),
	mint_url    TEXT    NOT NULL CHECK (mint_url <> ''),
	payment_id  INTEGER REFERENCES payments (id),
	state       TEXT    NOT NULL DEFAULT 'swapping' CHECK (state IN (
		'received', 'swapping', 'swapped', 'spent', 'rejected', 'released')),
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
);

INSERT INTO cashu_proofs_v8 (id, secret_hash, amount_sat, keyset_id, mint_url, payment_id, state, created_at, updated_at)
SELECT id, secret_hash, amount_sat, keyset_id, mint_url, payment_id, state, created_at, updated_at FROM cashu_proofs;

DROP TABLE cashu_proofs;
ALTER TABLE cashu_proofs_v8 RENAME TO cashu_proofs;

CREATE UNIQUE INDEX cashu_proofs_secret ON cashu_proofs (secret_hash) WHERE state <> 'released';
CREATE INDEX cashu_proofs_payment ON cashu_proofs (payment_id);
CREATE INDEX cashu_proofs_state ON cashu_proofs (state) WHERE state = 'swapping';

CREATE TRIGGER cashu_proofs_identity_immutable
BEFORE UPDATE OF secret_hash, y, amount_sat, keyset_id, mint_url, payment_id, created_at ON cashu_proofs
BEGIN
	SELECT RAISE(ABORT, 'capvend: a proof''s identity is immutable');
END;

CREATE TRIGGER cashu_proofs_no_delete
BEFORE DELETE ON cashu_proofs
BEGIN
	SELECT RAISE(ABORT, 'capvend: proofs are never deleted');
END;

-- Only a swap whose outcome is not recorded yet may end, once.
CREATE TRIGGER cashu_proofs_state_machine
BEFORE UPDATE OF state ON cashu_proofs
WHEN NEW.state <> OLD.state AND NOT (OLD.state = 'swapping'
	AND NEW.state IN ('swapped', 'spent', 'rejected', 'released'))
BEGIN
	SELECT RAISE(ABORT, 'capvend: illegal proof state transition');
END;
