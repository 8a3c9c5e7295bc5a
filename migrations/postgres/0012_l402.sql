-- capvend ledger, schema 12, PostgreSQL (see ../0012_l402.sql).
CREATE TABLE l402_root_keys (
	id         BIGINT PRIMARY KEY CHECK (id >= 1),
	root_key   BYTEA  NOT NULL CHECK (length(root_key) = 32),
	created_at BIGINT NOT NULL
);

CREATE TRIGGER l402_root_keys_immutable BEFORE UPDATE ON l402_root_keys
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: L402 root keys are immutable');

CREATE TRIGGER l402_root_keys_append_only BEFORE DELETE ON l402_root_keys
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: L402 root keys are append-only');

CREATE TRIGGER l402_root_keys_no_truncate BEFORE TRUNCATE ON l402_root_keys
FOR EACH STATEMENT EXECUTE FUNCTION capvend_refuse('capvend: L402 root keys are append-only');

CREATE TABLE l402_revocations (
	token_id   TEXT   PRIMARY KEY
		CHECK (length(token_id) = 64 AND token_id !~ '[^0-9a-f]'),
	reason     TEXT   NOT NULL,
	created_at BIGINT NOT NULL
);

CREATE TRIGGER l402_revocations_immutable BEFORE UPDATE ON l402_revocations
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: L402 revocations are immutable');

CREATE TRIGGER l402_revocations_append_only BEFORE DELETE ON l402_revocations
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: L402 revocations are append-only');

CREATE TRIGGER l402_revocations_no_truncate BEFORE TRUNCATE ON l402_revocations
FOR EACH STATEMENT EXECUTE FUNCTION capvend_refuse('capvend: L402 revocations are append-only');
