-- capvend ledger, schema 7: a request is bound to exactly what it asked
-- for, and every execution records what was sent upstream.
--
-- A request key (transport, client, request id) names one thing: a priced
-- call (calls) or a free use (free_uses). The same key coming back with
-- another kind, tool or arguments is refused (vend.ErrRequestReused), never
-- treated as a replay. Calls record their canonical argument hash since
-- schema 1; free uses record it from now on. A free use recorded before
-- has no hash (NULL) and never matches a replay.
ALTER TABLE free_uses ADD COLUMN args_hash TEXT CHECK (args_hash IS NULL OR length(args_hash) = 64);

-- The record of what was actually sent upstream: one row per execution
-- start (StartExecution, and ResumeExecution of an idempotent call a crash
-- interrupted), written in the same transaction as the claim, holding what
-- vend was about to send: the kind, server, tool (upstream name, or the
-- price key of a resource) and canonical argument hash. It must equal what
-- the call sold and was paid for (checked here and by 'ledger verify'), and
-- calls.executions counts these rows.
CREATE TABLE executions (
	id         INTEGER PRIMARY KEY,
	call_id    INTEGER NOT NULL REFERENCES calls (id),
	seq        INTEGER NOT NULL CHECK (seq >= 1), -- 1 for the first execution, 2 for a resumed one, ...
	kind       TEXT    NOT NULL CHECK (kind IN ('tool', 'prompt', 'resource')),
	server     TEXT    NOT NULL CHECK (server <> ''),
	tool       TEXT    NOT NULL CHECK (tool <> ''),
	args_hash  TEXT    NOT NULL CHECK (length(args_hash) = 64),
	started_at INTEGER NOT NULL,
	-- 1: written by this migration for a call that ran before executions
	-- were recorded; its values are the call's, not an observation.
	backfilled INTEGER NOT NULL DEFAULT 0 CHECK (backfilled IN (0, 1)),
	UNIQUE (call_id, seq)
);

WITH RECURSIVE n (call_id, seq) AS (
	SELECT id, 1 FROM calls WHERE executions > 0
	UNION ALL
	SELECT n.call_id, n.seq + 1 FROM n JOIN calls c ON c.id = n.call_id WHERE n.seq < c.executions)
INSERT INTO executions (call_id, seq, kind, server, tool, args_hash, started_at, backfilled)
SELECT c.id, n.seq, c.kind, c.server, c.tool, c.args_hash,
	coalesce((SELECT pc.claimed_at FROM payment_claims pc WHERE pc.call_id = c.id), c.updated_at), 1
FROM n JOIN calls c ON c.id = n.call_id
ORDER BY c.id, n.seq;

-- From now on an execution is written only for a claimed call that is
-- executing, in sequence, and only with exactly what the call sold.
CREATE TRIGGER executions_match_call
BEFORE INSERT ON executions
WHEN NEW.backfilled <> 0
	OR NOT EXISTS (SELECT 1 FROM calls c WHERE c.id = NEW.call_id AND c.state = 'executing'
		AND c.kind = NEW.kind AND c.server = NEW.server AND c.tool = NEW.tool AND c.args_hash = NEW.args_hash)
	OR NOT EXISTS (SELECT 1 FROM payment_claims WHERE call_id = NEW.call_id)
	OR NEW.seq <> (SELECT count(*) FROM executions WHERE call_id = NEW.call_id) + 1
BEGIN
	SELECT RAISE(ABORT, 'capvend: an execution must be the next one of a claimed, executing call and send exactly what it sold');
END;

CREATE TRIGGER executions_immutable
BEFORE UPDATE ON executions
BEGIN
	SELECT RAISE(ABORT, 'capvend: executions are immutable');
END;

CREATE TRIGGER executions_no_delete
BEFORE DELETE ON executions
BEGIN
	SELECT RAISE(ABORT, 'capvend: executions are never deleted');
END;

-- calls.executions is the number of recorded executions.
CREATE TRIGGER calls_executions_recorded
BEFORE UPDATE OF executions ON calls
WHEN NEW.executions <> (SELECT count(*) FROM executions WHERE call_id = NEW.id)
BEGIN
	SELECT RAISE(ABORT, 'capvend: every execution of a call is recorded in executions');
END;

-- A stored result is what a replay is answered with: never deleted.
CREATE TRIGGER results_no_delete
BEFORE DELETE ON results
BEGIN
	SELECT RAISE(ABORT, 'capvend: stored results are never deleted');
END;
