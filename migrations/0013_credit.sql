-- capvend ledger, schema 13: prepaid credit.
--
-- A client buys credit with a top-up (a priced call of capvend's own
-- capvend_topup tool, paid like any call: invoice, hold invoice, mint
-- quote or Cashu token) and then pays priced calls from it, without a
-- Lightning round trip. Money is in the journal as always:
--
--   top-up delivered   income:tools:capvend:topup      -> liabilities:credit:<account>
--   draw (call starts) liabilities:credit:<account>    -> liabilities:credit_drawn
--   call delivered     liabilities:credit_drawn        -> income of the item
--   call failed        liabilities:credit_drawn        -> liabilities:credit:<account> (give-back)
--   expiry             liabilities:credit:<account>    -> income:credit_expired
--   refund paid out    liabilities:credit:<account>    -> the asset that paid it
--
-- credit_moves is the account's own book: one row per journal entry above,
-- with the change to the account's balance (0 for a delivery). The balance
-- is kept in credit_accounts and can never be negative (CHECK): of two
-- draws on the last sats, the second's transaction is refused.

-- The key credit tokens are derived from (HMAC-SHA256 of the account id):
-- tokens are never stored, and the key never leaves the ledger.
CREATE TABLE credit_key (
	id  INTEGER PRIMARY KEY CHECK (id = 1),
	key BLOB    NOT NULL CHECK (length(key) = 32)
);
INSERT INTO credit_key (id, key) VALUES (1, randomblob(32));

CREATE TRIGGER credit_key_immutable
BEFORE UPDATE ON credit_key
BEGIN
	SELECT RAISE(ABORT, 'capvend: the credit key is immutable');
END;

CREATE TRIGGER credit_key_no_delete
BEFORE DELETE ON credit_key
BEGIN
	SELECT RAISE(ABORT, 'capvend: the credit key is never deleted');
END;

-- One row per credit account: "t" + 24 hex digits for a token account,
-- "nostr-" + a 64-hex pubkey for a Nostr client's own account.
CREATE TABLE credit_accounts (
	id           TEXT    PRIMARY KEY CHECK (
		(length(id) = 25 AND id GLOB 't*' AND substr(id, 2) NOT GLOB '*[^0-9a-f]*')
		OR (length(id) = 70 AND id GLOB 'nostr-*' AND substr(id, 7) NOT GLOB '*[^0-9a-f]*')),
	balance_msat INTEGER NOT NULL DEFAULT 0 CHECK (balance_msat >= 0),
	created_at   INTEGER NOT NULL,
	-- The last top-up: credit.expires_after counts from it.
	topped_up_at INTEGER
) WITHOUT ROWID;

CREATE TRIGGER credit_accounts_no_delete
BEFORE DELETE ON credit_accounts
BEGIN
	SELECT RAISE(ABORT, 'capvend: credit accounts are never deleted');
END;

CREATE TRIGGER credit_accounts_identity_immutable
BEFORE UPDATE OF id, created_at ON credit_accounts
BEGIN
	SELECT RAISE(ABORT, 'capvend: a credit account''s identity is immutable');
END;

-- A top-up call tops up exactly one account, named when it was quoted.
CREATE TABLE credit_topups (
	call_id    INTEGER PRIMARY KEY REFERENCES calls (id),
	account_id TEXT    NOT NULL REFERENCES credit_accounts (id),
	created_at INTEGER NOT NULL
);

CREATE TRIGGER credit_topups_immutable
BEFORE UPDATE ON credit_topups
BEGIN
	SELECT RAISE(ABORT, 'capvend: a top-up''s account is immutable');
END;

CREATE TRIGGER credit_topups_no_delete
BEFORE DELETE ON credit_topups
BEGIN
	SELECT RAISE(ABORT, 'capvend: top-ups are never deleted');
END;

CREATE TABLE credit_moves (
	id          INTEGER PRIMARY KEY,
	account_id  TEXT    NOT NULL REFERENCES credit_accounts (id),
	kind        TEXT    NOT NULL CHECK (kind IN ('topup', 'draw', 'deliver', 'giveback', 'expiry', 'refund')),
	-- The change to the account's balance.
	amount_msat INTEGER NOT NULL CHECK (
		(kind IN ('topup', 'giveback') AND amount_msat > 0)
		OR (kind IN ('draw', 'expiry', 'refund') AND amount_msat < 0)
		OR (kind = 'deliver' AND amount_msat = 0)),
	call_id     INTEGER REFERENCES calls (id),
	entry_id    INTEGER NOT NULL UNIQUE REFERENCES entries (id),
	reason      TEXT    NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL,
	-- A refund payout: how and what it was ('cashu' token or 'bolt11').
	method      TEXT    CHECK (method IS NULL OR method IN ('cashu', 'bolt11')),
	CHECK ((kind IN ('topup', 'draw', 'deliver', 'giveback')) = (call_id IS NOT NULL)),
	CHECK ((kind = 'refund') = (method IS NOT NULL))
);
CREATE INDEX credit_moves_account ON credit_moves (account_id);
-- One draw per call, one top-up per top-up call, and a draw ends once:
-- delivered or given back.
CREATE UNIQUE INDEX credit_moves_once ON credit_moves (call_id, kind IN ('deliver', 'giveback'))
	WHERE call_id IS NOT NULL;

-- A delivery or give-back closes the call's draw, for exactly its amount.
CREATE TRIGGER credit_moves_close_draw
BEFORE INSERT ON credit_moves
WHEN NEW.kind IN ('deliver', 'giveback') AND NOT EXISTS (SELECT 1 FROM credit_moves d
	WHERE d.call_id = NEW.call_id AND d.kind = 'draw' AND d.account_id = NEW.account_id
		AND (NEW.kind = 'deliver' OR d.amount_msat = -NEW.amount_msat))
BEGIN
	SELECT RAISE(ABORT, 'capvend: a delivery or give-back closes its call''s draw, for its amount');
END;

-- A top-up credits the account its call names, for the call's price, once
-- the call is delivered.
CREATE TRIGGER credit_moves_topup
BEFORE INSERT ON credit_moves
WHEN NEW.kind = 'topup' AND NOT EXISTS (SELECT 1 FROM credit_topups t JOIN calls c ON c.id = t.call_id
	WHERE t.call_id = NEW.call_id AND t.account_id = NEW.account_id AND c.price_msat = NEW.amount_msat)
BEGIN
	SELECT RAISE(ABORT, 'capvend: a top-up credits its call''s account with its price');
END;

-- The balance is the sum of the moves: every move changes it, in its own
-- transaction; the CHECK on balance_msat refuses one that would make it
-- negative.
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

-- An execution is covered by a payment claim (schema 7) or by a credit
-- draw of its call.
DROP TRIGGER executions_match_call;
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
