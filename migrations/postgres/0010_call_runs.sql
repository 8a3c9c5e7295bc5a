-- capvend ledger, schema 10, PostgreSQL (see ../0010_call_runs.sql).
ALTER TABLE calls ADD COLUMN run_id TEXT NOT NULL DEFAULT ''
	CHECK (length(run_id) <= 64);

CREATE TRIGGER calls_run_id_immutable BEFORE UPDATE OF run_id ON calls
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: a call''s run id is immutable');
