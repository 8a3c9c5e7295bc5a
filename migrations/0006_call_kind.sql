-- capvend ledger, schema 6: what a priced call sold.
--
-- Prompts (prompts/get) and resources (resources/read) can be priced like
-- tools. A call records which of the three it was, so the journal books
-- its income to income:tools:..., income:prompts:... or
-- income:resources:..., and a paid call interrupted by a restart is run
-- again as what it was. Calls recorded before are tool calls.
ALTER TABLE calls ADD COLUMN kind TEXT NOT NULL DEFAULT 'tool'
	CHECK (kind IN ('tool', 'prompt', 'resource'));

CREATE TRIGGER calls_kind_immutable
BEFORE UPDATE OF kind ON calls
BEGIN
	SELECT RAISE(ABORT, 'capvend: a call''s identity and price are immutable');
END;
