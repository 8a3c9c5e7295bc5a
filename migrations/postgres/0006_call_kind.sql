-- capvend ledger, schema 6, PostgreSQL (see ../0006_call_kind.sql).
ALTER TABLE calls ADD COLUMN kind TEXT NOT NULL DEFAULT 'tool'
	CHECK (kind IN ('tool', 'prompt', 'resource'));

CREATE TRIGGER calls_kind_immutable BEFORE UPDATE OF kind ON calls
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: a call''s identity and price are immutable');
