-- capvend ledger, schema 10: the run of capvend that recorded a call.
--
-- A Vendor draws a random run id when it is made and records it with every
-- call it records. At start, Recover finishes the calls of other runs (a
-- crash or a stop left them) and leaves its own run's to the requests
-- serving them. Telling the two apart by wall-clock time failed when the
-- clock stepped (and took a millisecond's sleep in every test). Calls
-- recorded before this schema have '' (a previous run's). Written once.
ALTER TABLE calls ADD COLUMN run_id TEXT NOT NULL DEFAULT ''
	CHECK (length(run_id) <= 64);

CREATE TRIGGER calls_run_id_immutable
BEFORE UPDATE OF run_id ON calls
BEGIN
	SELECT RAISE(ABORT, 'capvend: a call''s run id is immutable');
END;
