-- capvend ledger, schema 11, PostgreSQL (see ../0011_grant_tokens.sql).
CREATE TABLE grant_tokens (
	token_hash TEXT   PRIMARY KEY
		CHECK (length(token_hash) = 64 AND token_hash !~ '[^0-9a-f]'),
	call_id    BIGINT NOT NULL REFERENCES calls (id),
	expires_at BIGINT NOT NULL,
	created_at BIGINT NOT NULL
);

CREATE INDEX grant_tokens_call ON grant_tokens (call_id);

CREATE FUNCTION grant_tokens_explicit_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM call_arguments WHERE call_id = NEW.call_id AND explicit = 1) THEN
		RAISE EXCEPTION 'capvend: a payment token names an explicit-gating call';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER grant_tokens_explicit_only BEFORE INSERT ON grant_tokens
	FOR EACH ROW EXECUTE FUNCTION grant_tokens_explicit_only();

CREATE TRIGGER grant_tokens_immutable BEFORE UPDATE ON grant_tokens
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: payment tokens are immutable');

CREATE TRIGGER grant_tokens_append_only BEFORE DELETE ON grant_tokens
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: payment tokens are append-only');

CREATE TRIGGER grant_tokens_no_truncate BEFORE TRUNCATE ON grant_tokens
FOR EACH STATEMENT EXECUTE FUNCTION capvend_refuse('capvend: payment tokens are append-only');
