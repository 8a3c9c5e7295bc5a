-- capvend ledger, schema 3: the arguments of priced calls.
--
-- A paid call must never be lost: when capvend stops after a payment and
-- before the tool ran (or while an idempotent tool ran), it runs the call
-- again at start from what is recorded here, and keeps the result for the
-- client's replay. Written once with the call, never changed.
CREATE TABLE call_arguments (
	call_id   INTEGER PRIMARY KEY REFERENCES calls (id),
	tool_name TEXT    NOT NULL, -- the name the client called
	arguments BLOB    NOT NULL, -- JSON object
	-- 1: explicit gating; once paid, the call waits for the client to
	-- repeat it instead of running at once.
	explicit  INTEGER NOT NULL DEFAULT 0 CHECK (explicit IN (0, 1))
);

CREATE TRIGGER call_arguments_immutable
BEFORE UPDATE ON call_arguments
BEGIN
	SELECT RAISE(ABORT, 'capvend: call arguments are immutable');
END;
