-- capvend ledger, schema 24: stored answers are kept for a retention
-- period, then only their record (issue 30).
--
-- A stored result (results) is what a replay of a priced call is answered
-- with; a stored reply (request_replies) is what a Nostr request delivered
-- again is answered with. Kept whole forever, a tool answering 1 MB grows
-- the ledger by about 1 GB per thousand paid calls. Past the operator's
-- retention (ledger.results_retention: a setting of capvend, not of the
-- schema) the pruner replaces a body by its record: the SHA-256 of the
-- body (lower-case hex), its size in bytes and when it was pruned; the
-- error flag stays (results.is_error; a reply's is_error is read from
-- the body when it is pruned). The row itself stays: a replay of a pruned
-- answer is refused with an error, never answered empty and never run
-- again. Money (calls, payments, the journal, refunds, credit) is never
-- pruned.
--
-- Pruning is the one change a stored answer allows, and only in its own
-- form: from a full body (not pruned) to the empty body with that same
-- body's hash and size, the rest of the row unchanged. The trigger
-- recomputes the hash from the old body with capvend_sha256, a function
-- capvend registers on each of its connections: another program updating
-- a stored answer fails.

-- pruned_at is set (unix ms) exactly when the body was replaced by its
-- record: body_sha256 and body_size are set then, and the body is empty.
ALTER TABLE results ADD COLUMN body_sha256 TEXT;
ALTER TABLE results ADD COLUMN body_size INTEGER;
ALTER TABLE results ADD COLUMN pruned_at INTEGER CHECK (CASE WHEN pruned_at IS NULL
	THEN body_sha256 IS NULL AND body_size IS NULL
	ELSE body_sha256 IS NOT NULL AND length(body_sha256) = 64 AND body_sha256 NOT GLOB '*[^0-9a-f]*'
		AND body_size IS NOT NULL AND body_size >= 0 AND length(body) = 0 END);

-- The pruner's way to the oldest whole bodies (the columns after a large
-- body are not read without reading the body).
CREATE INDEX results_unpruned ON results (stored_at) WHERE pruned_at IS NULL;

DROP TRIGGER results_immutable;

CREATE TRIGGER results_immutable
BEFORE UPDATE ON results
WHEN NOT coalesce(OLD.pruned_at IS NULL AND NEW.pruned_at IS NOT NULL
	AND NEW.call_id = OLD.call_id AND NEW.is_error = OLD.is_error AND NEW.stored_at = OLD.stored_at
	AND NEW.pruned_at >= OLD.stored_at AND length(CAST(NEW.body AS BLOB)) = 0
	AND NEW.body_size = length(CAST(OLD.body AS BLOB)) AND NEW.body_sha256 = capvend_sha256(OLD.body), 0)
BEGIN
	SELECT RAISE(ABORT, 'capvend: stored results are immutable; only pruning a body to its hash record is allowed');
END;

-- The same record for a stored reply; is_error is NULL until then.
ALTER TABLE request_replies ADD COLUMN is_error INTEGER;
ALTER TABLE request_replies ADD COLUMN reply_sha256 TEXT;
ALTER TABLE request_replies ADD COLUMN reply_size INTEGER;
ALTER TABLE request_replies ADD COLUMN pruned_at INTEGER CHECK (CASE WHEN pruned_at IS NULL
	THEN is_error IS NULL AND reply_sha256 IS NULL AND reply_size IS NULL
	ELSE is_error IS NOT NULL AND is_error IN (0, 1)
		AND reply_sha256 IS NOT NULL AND length(reply_sha256) = 64 AND reply_sha256 NOT GLOB '*[^0-9a-f]*'
		AND reply_size IS NOT NULL AND reply_size >= 0 AND length(reply) = 0 END);

CREATE INDEX request_replies_unpruned ON request_replies (created_at) WHERE pruned_at IS NULL;

-- A stored reply is written once and then only pruned (or deleted once
-- its request is too old to be delivered again).
CREATE TRIGGER request_replies_prune_only
BEFORE UPDATE ON request_replies
WHEN NOT coalesce(OLD.pruned_at IS NULL AND NEW.pruned_at IS NOT NULL
	AND NEW.request_key = OLD.request_key AND NEW.created_at = OLD.created_at
	AND NEW.pruned_at >= OLD.created_at AND length(CAST(NEW.reply AS BLOB)) = 0
	AND NEW.reply_size = length(CAST(OLD.reply AS BLOB)) AND NEW.reply_sha256 = capvend_sha256(OLD.reply), 0)
BEGIN
	SELECT RAISE(ABORT, 'capvend: stored replies are immutable; only pruning a reply to its hash record is allowed');
END;
