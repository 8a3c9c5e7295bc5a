-- capvend ledger, schema 23, PostgreSQL (see ../0023_releases.sql).
ALTER TABLE executions ADD COLUMN released_by TEXT CHECK (released_by IS NULL OR released_by <> '');
ALTER TABLE executions ADD COLUMN released_transport TEXT;
ALTER TABLE executions ADD COLUMN released_client TEXT;

CREATE FUNCTION executions_released() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.backfilled = 0 AND (NEW.released_by IS NULL OR NEW.released_transport IS NULL OR NEW.released_client IS NULL) THEN
		RAISE EXCEPTION 'capvend: an execution records the scheme, transport and client that released its call';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER executions_released BEFORE INSERT ON executions
	FOR EACH ROW EXECUTE FUNCTION executions_released();
