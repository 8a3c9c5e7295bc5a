-- capvend ledger, schema 1.
--
-- Times are INTEGER unix milliseconds (UTC). Money is INTEGER millisatoshis.
-- Money rules are schema rules: UNIQUE keys make claims exactly-once, CHECKs
-- pin the states, triggers refuse illegal call transitions and any change to
-- a posting, and an entry can only be sealed when its postings sum to zero.

-- The legal edges of a call's state machine. vend.CallState.CanTransition is
-- the same table in Go; a test keeps the two equal.
CREATE TABLE call_transitions (
	from_state TEXT NOT NULL,
	to_state   TEXT NOT NULL,
	PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;

INSERT INTO call_transitions (from_state, to_state) VALUES
	('quoted', 'awaiting_payment'),
	('quoted', 'expired'),
	('quoted', 'canceled'),
	('awaiting_payment', 'paid'),
	('awaiting_payment', 'expired'),
	('awaiting_payment', 'canceled'),
	('paid', 'executing'),
	('paid', 'refunded'),
	('executing', 'delivered'),
	('executing', 'failed'),
	('failed', 'refunded');

-- One row per priced request.
CREATE TABLE calls (
	id           INTEGER PRIMARY KEY,
	transport    TEXT    NOT NULL CHECK (transport <> ''),
	client       TEXT    NOT NULL CHECK (client <> ''),
	request_id   TEXT    NOT NULL CHECK (request_id <> ''),
	server       TEXT    NOT NULL CHECK (server <> ''),
	tool         TEXT    NOT NULL CHECK (tool <> ''),
	args_hash    TEXT    NOT NULL CHECK (length(args_hash) = 64),
	price_msat   INTEGER NOT NULL CHECK (price_msat > 0),
	idempotent   INTEGER NOT NULL DEFAULT 1 CHECK (idempotent IN (0, 1)),
	state        TEXT    NOT NULL DEFAULT 'quoted' CHECK (state IN (
		'quoted', 'awaiting_payment', 'paid', 'executing',
		'delivered', 'failed', 'refunded', 'expired', 'canceled')),
	executions   INTEGER NOT NULL DEFAULT 0 CHECK (executions >= 0),
	reason       TEXT    NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	-- A replayed request (same transport, client and request id) finds
	-- this row instead of creating a second one.
	UNIQUE (transport, client, request_id)
);
CREATE INDEX calls_state ON calls (state);
CREATE INDEX calls_grant ON calls (client, args_hash, state);

CREATE TRIGGER calls_state_machine
BEFORE UPDATE OF state ON calls
WHEN NEW.state <> OLD.state AND NOT EXISTS (
	SELECT 1 FROM call_transitions WHERE from_state = OLD.state AND to_state = NEW.state)
BEGIN
	SELECT RAISE(ABORT, 'capvend: illegal call state transition');
END;

CREATE TRIGGER calls_identity_immutable
BEFORE UPDATE OF transport, client, request_id, server, tool, args_hash, price_msat, created_at ON calls
BEGIN
	SELECT RAISE(ABORT, 'capvend: a call''s identity and price are immutable');
END;

CREATE TRIGGER calls_no_delete
BEFORE DELETE ON calls
BEGIN
	SELECT RAISE(ABORT, 'capvend: calls are never deleted');
END;

-- A payment request handed to a client: an LND invoice (ref = payment hash)
-- or a Cashu mint quote (ref = quote id) or a received Cashu token
-- (ref = token hash).
CREATE TABLE payments (
	id             INTEGER PRIMARY KEY,
	backend        TEXT    NOT NULL CHECK (backend IN ('lnd', 'cashu')),
	kind           TEXT    NOT NULL CHECK (kind IN ('invoice', 'hold_invoice', 'mint_quote', 'token')),
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
	CHECK ((state = 'settled') = (settled_at IS NOT NULL AND settled_msat IS NOT NULL))
);
CREATE INDEX payments_call ON payments (call_id);
CREATE INDEX payments_state ON payments (state, expires_at);

CREATE TABLE payment_transitions (
	from_state TEXT NOT NULL,
	to_state   TEXT NOT NULL,
	PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;

INSERT INTO payment_transitions (from_state, to_state) VALUES
	('open', 'accepted'),
	('open', 'settled'),
	('open', 'canceled'),
	('open', 'expired'),
	('accepted', 'settled'),
	('accepted', 'canceled');

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

-- A settled payment is consumed by exactly one call (a paid grant is
-- single-use): the primary key makes the claim exactly-once.
CREATE TABLE payment_claims (
	payment_id INTEGER PRIMARY KEY REFERENCES payments (id),
	call_id    INTEGER NOT NULL UNIQUE REFERENCES calls (id),
	claimed_at INTEGER NOT NULL
);

CREATE TRIGGER payment_claims_immutable
BEFORE UPDATE ON payment_claims
BEGIN
	SELECT RAISE(ABORT, 'capvend: claims are immutable');
END;

CREATE TRIGGER payment_claims_no_delete
BEFORE DELETE ON payment_claims
BEGIN
	SELECT RAISE(ABORT, 'capvend: claims are immutable');
END;

-- Cashu proofs received. Only a hash of the proof secret is kept: the
-- secret itself is bearer money.
CREATE TABLE cashu_proofs (
	id          INTEGER PRIMARY KEY,
	secret_hash TEXT    NOT NULL UNIQUE CHECK (length(secret_hash) = 64),
	amount_sat  INTEGER NOT NULL CHECK (amount_sat > 0),
	keyset_id   TEXT    NOT NULL CHECK (keyset_id <> ''),
	mint_url    TEXT    NOT NULL CHECK (mint_url <> ''),
	payment_id  INTEGER REFERENCES payments (id),
	state       TEXT    NOT NULL DEFAULT 'received' CHECK (state IN ('received', 'swapped', 'spent', 'rejected')),
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
);
CREATE INDEX cashu_proofs_payment ON cashu_proofs (payment_id);

CREATE TRIGGER cashu_proofs_identity_immutable
BEFORE UPDATE OF secret_hash, amount_sat, keyset_id, mint_url, created_at ON cashu_proofs
BEGIN
	SELECT RAISE(ABORT, 'capvend: a proof''s identity is immutable');
END;

CREATE TRIGGER cashu_proofs_no_delete
BEFORE DELETE ON cashu_proofs
BEGIN
	SELECT RAISE(ABORT, 'capvend: proofs are never deleted');
END;

-- The answer to a call, kept so a repeated request gets the same answer
-- without paying or executing again.
CREATE TABLE results (
	call_id   INTEGER PRIMARY KEY REFERENCES calls (id),
	is_error  INTEGER NOT NULL CHECK (is_error IN (0, 1)),
	body      BLOB    NOT NULL,
	stored_at INTEGER NOT NULL
);

CREATE TRIGGER results_immutable
BEFORE UPDATE ON results
BEGIN
	SELECT RAISE(ABORT, 'capvend: stored results are immutable');
END;

-- Where an LND invoice subscription resumes after a restart.
CREATE TABLE lnd_cursors (
	node         TEXT    PRIMARY KEY,
	add_index    INTEGER NOT NULL DEFAULT 0 CHECK (add_index >= 0),
	settle_index INTEGER NOT NULL DEFAULT 0 CHECK (settle_index >= 0),
	updated_at   INTEGER NOT NULL
);

-- Double-entry journal.
CREATE TABLE accounts (
	id         INTEGER PRIMARY KEY,
	name       TEXT    NOT NULL UNIQUE,
	type       TEXT    NOT NULL CHECK (type IN ('assets', 'liabilities', 'equity', 'income', 'expenses')),
	created_at INTEGER NOT NULL,
	CHECK (name = type OR substr(name, 1, length(type) + 1) = type || ':')
);

CREATE TABLE entries (
	id          INTEGER PRIMARY KEY,
	ts          INTEGER NOT NULL,
	kind        TEXT    NOT NULL CHECK (kind IN ('settlement', 'refund', 'fee', 'melt', 'adjustment')),
	description TEXT    NOT NULL,
	call_id     INTEGER REFERENCES calls (id),
	payment_id  INTEGER REFERENCES payments (id),
	-- An entry is written open, its postings added, then sealed; sealing
	-- checks the balance. Only sealed entries count.
	sealed      INTEGER NOT NULL DEFAULT 0 CHECK (sealed IN (0, 1))
);
CREATE INDEX entries_ts ON entries (ts);
CREATE INDEX entries_payment ON entries (payment_id, kind);
CREATE INDEX entries_call ON entries (call_id);

CREATE TABLE postings (
	id          INTEGER PRIMARY KEY,
	entry_id    INTEGER NOT NULL REFERENCES entries (id),
	account_id  INTEGER NOT NULL REFERENCES accounts (id),
	amount_msat INTEGER NOT NULL CHECK (amount_msat <> 0)
);
CREATE INDEX postings_entry ON postings (entry_id);
CREATE INDEX postings_account ON postings (account_id);

CREATE TRIGGER postings_only_into_open_entries
BEFORE INSERT ON postings
WHEN (SELECT sealed FROM entries WHERE id = NEW.entry_id) IS NOT 0
BEGIN
	SELECT RAISE(ABORT, 'capvend: postings can only be added to an open entry');
END;

CREATE TRIGGER postings_no_update
BEFORE UPDATE ON postings
BEGIN
	SELECT RAISE(ABORT, 'capvend: postings are immutable');
END;

CREATE TRIGGER postings_no_delete
BEFORE DELETE ON postings
BEGIN
	SELECT RAISE(ABORT, 'capvend: postings are immutable');
END;

CREATE TRIGGER entries_seal_balanced
BEFORE UPDATE ON entries
WHEN NOT (OLD.sealed = 0 AND NEW.sealed = 1
	AND NEW.id = OLD.id AND NEW.ts = OLD.ts AND NEW.kind = OLD.kind
	AND NEW.description = OLD.description
	AND NEW.call_id IS OLD.call_id AND NEW.payment_id IS OLD.payment_id)
BEGIN
	SELECT RAISE(ABORT, 'capvend: entries are immutable once written; only sealing is allowed');
END;

CREATE TRIGGER entries_seal_requires_balance
BEFORE UPDATE OF sealed ON entries
WHEN NEW.sealed = 1 AND (
	(SELECT count(*) FROM postings WHERE entry_id = NEW.id) < 2
	OR (SELECT coalesce(sum(amount_msat), 0) FROM postings WHERE entry_id = NEW.id) <> 0)
BEGIN
	SELECT RAISE(ABORT, 'capvend: an entry must have at least two postings summing to zero');
END;

CREATE TRIGGER entries_no_delete
BEFORE DELETE ON entries
BEGIN
	SELECT RAISE(ABORT, 'capvend: entries are never deleted');
END;
