-- capvend ledger, schema 3, PostgreSQL (see ../0003_call_arguments.sql).
CREATE TABLE call_arguments (
	call_id   BIGINT  PRIMARY KEY REFERENCES calls (id),
	tool_name TEXT    NOT NULL,
	arguments BYTEA   NOT NULL,
	explicit  INTEGER NOT NULL DEFAULT 0 CHECK (explicit IN (0, 1))
);

CREATE TRIGGER call_arguments_immutable BEFORE UPDATE ON call_arguments
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: call arguments are immutable');
