-- capvend ledger, schema 27, PostgreSQL (see ../0027_handed_out.sql).
CREATE TABLE cashu_handed_out (
	secret_hash TEXT   PRIMARY KEY CHECK (length(secret_hash) = 64),
	mint_url    TEXT   NOT NULL CHECK (mint_url <> ''),
	amount_sat  BIGINT NOT NULL CHECK (amount_sat > 0),
	kind        TEXT   NOT NULL CHECK (kind IN ('change')),
	ref         TEXT   NOT NULL DEFAULT '',
	created_at  BIGINT NOT NULL
);

CREATE TRIGGER cashu_handed_out_immutable BEFORE UPDATE ON cashu_handed_out
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: the record of ecash handed out is immutable');

CREATE TRIGGER cashu_handed_out_no_delete BEFORE DELETE ON cashu_handed_out
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: the record of ecash handed out is never deleted');

CREATE TRIGGER cashu_handed_out_no_truncate BEFORE TRUNCATE ON cashu_handed_out
FOR EACH STATEMENT EXECUTE FUNCTION capvend_refuse('capvend: the record of ecash handed out is never deleted');
