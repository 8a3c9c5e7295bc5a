-- capvend ledger, schema 24, PostgreSQL (see ../0024_result_retention.sql).
-- The trigger recomputes the hash with PostgreSQL's own sha256().
ALTER TABLE results ADD COLUMN body_sha256 TEXT;
ALTER TABLE results ADD COLUMN body_size BIGINT;
ALTER TABLE results ADD COLUMN pruned_at BIGINT;
ALTER TABLE results ADD CONSTRAINT results_pruned_record CHECK (CASE WHEN pruned_at IS NULL
	THEN body_sha256 IS NULL AND body_size IS NULL
	ELSE body_sha256 IS NOT NULL AND body_sha256 ~ '^[0-9a-f]{64}$'
		AND body_size IS NOT NULL AND body_size >= 0 AND octet_length(body) = 0 END);

CREATE INDEX results_unpruned ON results (stored_at) WHERE pruned_at IS NULL;

CREATE FUNCTION results_prune_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NOT coalesce(OLD.pruned_at IS NULL AND NEW.pruned_at IS NOT NULL
		AND NEW.call_id = OLD.call_id AND NEW.is_error = OLD.is_error AND NEW.stored_at = OLD.stored_at
		AND NEW.pruned_at >= OLD.stored_at AND octet_length(NEW.body) = 0
		AND NEW.body_size = octet_length(OLD.body) AND NEW.body_sha256 = encode(sha256(OLD.body), 'hex'), false) THEN
		RAISE EXCEPTION 'capvend: stored results are immutable; only pruning a body to its hash record is allowed';
	END IF;
	RETURN NEW;
END $$;

DROP TRIGGER results_immutable ON results;
CREATE TRIGGER results_immutable BEFORE UPDATE ON results
	FOR EACH ROW EXECUTE FUNCTION results_prune_only();

ALTER TABLE request_replies ADD COLUMN is_error INTEGER;
ALTER TABLE request_replies ADD COLUMN reply_sha256 TEXT;
ALTER TABLE request_replies ADD COLUMN reply_size BIGINT;
ALTER TABLE request_replies ADD COLUMN pruned_at BIGINT;
ALTER TABLE request_replies ADD CONSTRAINT request_replies_pruned_record CHECK (CASE WHEN pruned_at IS NULL
	THEN is_error IS NULL AND reply_sha256 IS NULL AND reply_size IS NULL
	ELSE is_error IS NOT NULL AND is_error IN (0, 1)
		AND reply_sha256 IS NOT NULL AND reply_sha256 ~ '^[0-9a-f]{64}$'
		AND reply_size IS NOT NULL AND reply_size >= 0 AND octet_length(reply) = 0 END);

CREATE INDEX request_replies_unpruned ON request_replies (created_at) WHERE pruned_at IS NULL;

CREATE FUNCTION request_replies_prune_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NOT coalesce(OLD.pruned_at IS NULL AND NEW.pruned_at IS NOT NULL
		AND NEW.request_key = OLD.request_key AND NEW.created_at = OLD.created_at
		AND NEW.pruned_at >= OLD.created_at AND octet_length(NEW.reply) = 0
		AND NEW.reply_size = octet_length(OLD.reply) AND NEW.reply_sha256 = encode(sha256(OLD.reply), 'hex'), false) THEN
		RAISE EXCEPTION 'capvend: stored replies are immutable; only pruning a reply to its hash record is allowed';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER request_replies_prune_only BEFORE UPDATE ON request_replies
	FOR EACH ROW EXECUTE FUNCTION request_replies_prune_only();
