-- capvend ledger, schema 22: money paid out is reserved before it leaves.
--
-- Every payout from capvend's Cashu wallet (a credit account's balance
-- paid back, a refund owed for a call, the operator's withdrawal) is a
-- payouts row, written 'reserved' in its own transaction BEFORE anything
-- leaves the wallet: what it pays, how (a Cashu token, or a bolt11 paid
-- by a melt), from which mint and which wallet, and for a melt the quote
-- id. Then the money leaves (the melt is paid, the token is made: its
-- token is recorded on the row before it is handed over), and one more
-- transaction ends the reservation, once:
--
--   booked    the money left: the payout's journal entry is posted;
--   released  it did not leave: the reservation is undone.
--
-- A reservation left by a process that died between paying and booking
-- is resolved from the mint's word (the melt quote's state, the token's
-- proof states) by the next process that opens its wallet.
--
-- Credit. The reservation takes the amount out of the account's balance
-- at once, by a credit move of kind 'payout' (the balance CHECK refuses a
-- reservation the balance does not cover): a draw on another instance can
-- never spend reserved money, and the booking can never fail for lack of
-- balance. The journal keeps the reserved money in a holding account:
--
--   reserve   liabilities:credit:<account>  -> liabilities:credit_reserved
--   book      liabilities:credit_reserved   -> assets:cashu:<mint> (fee an expense)
--   release   liabilities:credit_reserved   -> liabilities:credit:<account> (a 'release' move)
--
-- Refunds. A refund owed is money in liabilities:refunds already, owed to
-- its client: the reservation moves nothing, it claims the refund for one
-- payer (one reservation not released per refund: UNIQUE), so a second
-- payer (another instance paying it on the client's replay, the operator)
-- is refused before it makes a token or melts. The refund becomes 'paid'
-- only through its reserved payout, in the transaction that books it.
--
-- Withdrawals. The reservation records the melt quote before it is paid;
-- the booking posts the melt entry (equity:withdrawals).
CREATE TABLE payouts (
	id               INTEGER PRIMARY KEY,
	kind             TEXT    NOT NULL CHECK (kind IN ('credit', 'refund', 'withdrawal')),
	account_id       TEXT    REFERENCES credit_accounts (id), -- credit
	refund_id        INTEGER REFERENCES refunds (id),         -- refund
	method           TEXT    NOT NULL CHECK (method IN ('cashu', 'bolt11')),
	mint_url         TEXT    NOT NULL CHECK (mint_url <> ''),
	-- The wallet that pays it ('' for a payout booked at once, that
	-- nothing needs to resolve): only a process holding that wallet
	-- resolves a reservation it left.
	wallet           TEXT    NOT NULL DEFAULT '',
	-- What the recipient gets: a token's value, an invoice's amount.
	amount_msat      INTEGER NOT NULL CHECK (amount_msat > 0),
	invoice          TEXT    NOT NULL DEFAULT '' CHECK (length(invoice) <= 2048),
	quote            TEXT,    -- bolt11: the melt quote, recorded before it is paid
	fee_reserve_msat INTEGER NOT NULL DEFAULT 0 CHECK (fee_reserve_msat >= 0),
	token            TEXT,    -- cashu: the token, recorded before it is handed over (bearer: never exported)
	fee_msat         INTEGER CHECK (fee_msat >= 0), -- what paying cost beyond amount_msat
	state            TEXT    NOT NULL DEFAULT 'reserved' CHECK (state IN ('reserved', 'booked', 'released')),
	reason           TEXT    NOT NULL DEFAULT '', -- why it was released
	created_at       INTEGER NOT NULL,
	ended_at         INTEGER,
	reserve_entry_id INTEGER UNIQUE REFERENCES entries (id), -- credit: the reservation's entry
	end_entry_id     INTEGER UNIQUE REFERENCES entries (id), -- booked: the payout's entry; a released credit payout: the release's
	CHECK ((kind = 'credit') = (account_id IS NOT NULL)),
	CHECK ((kind = 'refund') = (refund_id IS NOT NULL)),
	CHECK ((kind = 'credit') = (reserve_entry_id IS NOT NULL)),
	CHECK (kind <> 'withdrawal' OR method = 'bolt11'),
	CHECK (method = 'bolt11' OR (quote IS NULL AND invoice = '')),
	CHECK (method = 'cashu' OR token IS NULL),
	CHECK ((state = 'reserved') = (ended_at IS NULL)),
	CHECK (state <> 'booked' OR (fee_msat IS NOT NULL AND end_entry_id IS NOT NULL)),
	CHECK (state = 'booked' OR end_entry_id IS NULL OR (state = 'released' AND kind = 'credit')),
	CHECK (state <> 'released' OR kind <> 'credit' OR end_entry_id IS NOT NULL)
);
-- One payer per refund: a second reservation is refused while the first
-- is in flight, and once it is booked.
CREATE UNIQUE INDEX payouts_refund_once ON payouts (refund_id) WHERE refund_id IS NOT NULL AND state <> 'released';
-- A melt quote pays one payout.
CREATE UNIQUE INDEX payouts_quote ON payouts (quote) WHERE quote IS NOT NULL;
CREATE INDEX payouts_reserved ON payouts (state) WHERE state = 'reserved';

CREATE TRIGGER payouts_no_delete
BEFORE DELETE ON payouts
BEGIN
	SELECT RAISE(ABORT, 'capvend: payouts are never deleted');
END;

-- Reserved, then booked or released once; what it pays never changes
-- (its token is written once, while it is reserved).
CREATE TRIGGER payouts_state_machine
BEFORE UPDATE ON payouts
WHEN NOT (OLD.state = 'reserved'
	AND NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.account_id IS OLD.account_id AND NEW.refund_id IS OLD.refund_id
	AND NEW.method = OLD.method AND NEW.mint_url = OLD.mint_url AND NEW.wallet = OLD.wallet
	AND NEW.amount_msat = OLD.amount_msat AND NEW.invoice = OLD.invoice AND NEW.quote IS OLD.quote
	AND NEW.fee_reserve_msat = OLD.fee_reserve_msat AND NEW.created_at = OLD.created_at
	AND NEW.reserve_entry_id IS OLD.reserve_entry_id AND (OLD.token IS NULL OR NEW.token IS OLD.token))
BEGIN
	SELECT RAISE(ABORT, 'capvend: a payout is reserved once, then booked or released once; what it pays never changes');
END;

-- A refund is paid only through its payout reserved before the money left.
CREATE TRIGGER refunds_paid_reserved
BEFORE UPDATE OF state ON refunds
WHEN NEW.state = 'paid' AND NOT EXISTS (SELECT 1 FROM payouts p WHERE p.refund_id = NEW.id AND p.state = 'reserved'
	AND p.method = NEW.method AND p.amount_msat = NEW.paid_msat AND p.mint_url = NEW.mint_url)
BEGIN
	SELECT RAISE(ABORT, 'capvend: a refund is paid only through its payout, reserved before the money left');
END;

-- credit_moves gains two kinds, and the payout they belong to: 'payout'
-- (the reservation, < 0) and 'release' (a released reservation given
-- back, > 0). A payout of credit is no longer booked as a 'refund' move
-- at once; the kind stays for the moves booked before this schema. The
-- table is rebuilt to widen its CHECKs; its rows are kept. The trigger
-- of executions that reads it is dropped and made again around it.
DROP TRIGGER executions_match_call;
DROP TRIGGER credit_moves_close_draw;
DROP TRIGGER credit_moves_topup;
DROP TRIGGER credit_moves_balance;
DROP TRIGGER credit_moves_immutable;
DROP TRIGGER credit_moves_no_delete;
DROP INDEX credit_moves_account;
DROP INDEX credit_moves_once;

CREATE TABLE credit_moves_v22 (
	id          INTEGER PRIMARY KEY,
	account_id  TEXT    NOT NULL REFERENCES credit_accounts (id),
	kind        TEXT    NOT NULL CHECK (kind IN ('topup', 'draw', 'deliver', 'giveback', 'expiry', 'refund', 'payout', 'release')),
	amount_msat INTEGER NOT NULL CHECK (
		(kind IN ('topup', 'giveback', 'release') AND amount_msat > 0)
		OR (kind IN ('draw', 'expiry', 'refund', 'payout') AND amount_msat < 0)
		OR (kind = 'deliver' AND amount_msat = 0)),
	call_id     INTEGER REFERENCES calls (id),
	entry_id    INTEGER NOT NULL UNIQUE REFERENCES entries (id),
	reason      TEXT    NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL,
	method      TEXT    CHECK (method IS NULL OR method IN ('cashu', 'bolt11')),
	payout_id   INTEGER REFERENCES payouts (id),
	CHECK ((kind IN ('topup', 'draw', 'deliver', 'giveback')) = (call_id IS NOT NULL)),
	CHECK ((kind IN ('refund', 'payout', 'release')) = (method IS NOT NULL)),
	CHECK ((kind IN ('payout', 'release')) = (payout_id IS NOT NULL))
);

INSERT INTO credit_moves_v22 (id, account_id, kind, amount_msat, call_id, entry_id, reason, created_at, method)
SELECT id, account_id, kind, amount_msat, call_id, entry_id, reason, created_at, method FROM credit_moves;

DROP TABLE credit_moves;
ALTER TABLE credit_moves_v22 RENAME TO credit_moves;

CREATE INDEX credit_moves_account ON credit_moves (account_id);
CREATE UNIQUE INDEX credit_moves_once ON credit_moves (call_id, kind IN ('deliver', 'giveback'))
	WHERE call_id IS NOT NULL;
-- One reservation and at most one release per payout.
CREATE UNIQUE INDEX credit_moves_payout ON credit_moves (payout_id, kind) WHERE payout_id IS NOT NULL;

CREATE TRIGGER credit_moves_close_draw
BEFORE INSERT ON credit_moves
WHEN NEW.kind IN ('deliver', 'giveback') AND NOT EXISTS (SELECT 1 FROM credit_moves d
	WHERE d.call_id = NEW.call_id AND d.kind = 'draw' AND d.account_id = NEW.account_id
		AND (NEW.kind = 'deliver' OR d.amount_msat = -NEW.amount_msat))
BEGIN
	SELECT RAISE(ABORT, 'capvend: a delivery or give-back closes its call''s draw, for its amount');
END;

CREATE TRIGGER credit_moves_topup
BEFORE INSERT ON credit_moves
WHEN NEW.kind = 'topup' AND NOT EXISTS (SELECT 1 FROM credit_topups t JOIN calls c ON c.id = t.call_id
	WHERE t.call_id = NEW.call_id AND t.account_id = NEW.account_id AND c.price_msat = NEW.amount_msat)
BEGIN
	SELECT RAISE(ABORT, 'capvend: a top-up credits its call''s account with its price');
END;

-- A payout move is its credit payout's reservation (with the payout's
-- reservation entry), a release move gives a released one back (with
-- its release entry), each for the payout's amount, on its account. No
-- new 'refund' move: credit is paid out through a reserved payout.
CREATE TRIGGER credit_moves_payout
BEFORE INSERT ON credit_moves
WHEN NEW.kind = 'refund' OR (NEW.kind IN ('payout', 'release') AND NOT EXISTS (SELECT 1 FROM payouts p
	WHERE p.id = NEW.payout_id AND p.kind = 'credit' AND p.account_id = NEW.account_id AND p.method = NEW.method
		AND ((NEW.kind = 'payout' AND p.state = 'reserved' AND p.reserve_entry_id = NEW.entry_id AND p.amount_msat = -NEW.amount_msat)
			OR (NEW.kind = 'release' AND p.state = 'released' AND p.end_entry_id = NEW.entry_id AND p.amount_msat = NEW.amount_msat))))
BEGIN
	SELECT RAISE(ABORT, 'capvend: credit is paid out through a payout: reserved from the balance, given back if released');
END;

CREATE TRIGGER credit_moves_balance
AFTER INSERT ON credit_moves
BEGIN
	UPDATE credit_accounts SET balance_msat = balance_msat + NEW.amount_msat,
		topped_up_at = CASE WHEN NEW.kind = 'topup' THEN NEW.created_at ELSE topped_up_at END
	WHERE id = NEW.account_id;
END;

CREATE TRIGGER credit_moves_immutable
BEFORE UPDATE ON credit_moves
BEGIN
	SELECT RAISE(ABORT, 'capvend: credit moves are immutable');
END;

CREATE TRIGGER credit_moves_no_delete
BEFORE DELETE ON credit_moves
BEGIN
	SELECT RAISE(ABORT, 'capvend: credit moves are never deleted');
END;

CREATE TRIGGER executions_match_call
BEFORE INSERT ON executions
WHEN NEW.backfilled <> 0
	OR NOT EXISTS (SELECT 1 FROM calls c WHERE c.id = NEW.call_id AND c.state = 'executing'
		AND c.kind = NEW.kind AND c.server = NEW.server AND c.tool = NEW.tool AND c.args_hash = NEW.args_hash)
	OR (NOT EXISTS (SELECT 1 FROM payment_claims WHERE call_id = NEW.call_id)
		AND NOT EXISTS (SELECT 1 FROM credit_moves WHERE call_id = NEW.call_id AND kind = 'draw'))
	OR NEW.seq <> (SELECT count(*) FROM executions WHERE call_id = NEW.call_id) + 1
BEGIN
	SELECT RAISE(ABORT, 'capvend: an execution must be the next one of a claimed, executing call and send exactly what it sold');
END;

-- (After credit_moves is made again: the trigger reads it.) A credit
-- payout's reservation moved its account's credit; its end is
-- the entry that pays it out of liabilities:credit_reserved (booked) or
-- gives it back (released). A refund's payout is booked with the refund
-- paid by that entry, for its amount; a withdrawal's by a melt entry to
-- equity:withdrawals.
CREATE TRIGGER payouts_end
BEFORE UPDATE OF state ON payouts
WHEN NEW.state <> 'reserved' AND NOT (
	(NEW.kind = 'credit'
		AND EXISTS (SELECT 1 FROM credit_moves m WHERE m.payout_id = NEW.id AND m.kind = 'payout')
		AND EXISTS (SELECT 1 FROM entries e JOIN postings p ON p.entry_id = e.id JOIN accounts a ON a.id = p.account_id
			WHERE e.id = NEW.end_entry_id AND e.sealed = 1 AND e.kind = 'adjustment'
				AND a.name = 'liabilities:credit_reserved' AND p.amount_msat = NEW.amount_msat))
	OR (NEW.kind = 'refund' AND NEW.state = 'released')
	OR (NEW.kind = 'refund' AND EXISTS (SELECT 1 FROM refunds r WHERE r.id = NEW.refund_id AND r.state = 'paid'
		AND r.entry_id = NEW.end_entry_id AND r.paid_msat = NEW.amount_msat AND r.method = NEW.method))
	OR (NEW.kind = 'withdrawal' AND NEW.state = 'released')
	OR (NEW.kind = 'withdrawal' AND EXISTS (SELECT 1 FROM entries e JOIN postings p ON p.entry_id = e.id
		JOIN accounts a ON a.id = p.account_id WHERE e.id = NEW.end_entry_id AND e.sealed = 1 AND e.kind = 'melt'
			AND a.name = 'equity:withdrawals' AND p.amount_msat = NEW.amount_msat)))
BEGIN
	SELECT RAISE(ABORT, 'capvend: a payout ends with its entry: booked out of what it reserved, or released back');
END;
