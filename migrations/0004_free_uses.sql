-- capvend ledger, schema 4: daily free quotas.
--
-- A tool may give each client a few free calls per UTC day. Each free call
-- is one row, claimed in the same transaction that counts the client's
-- uses of the tool that day (INSERT ... SELECT ... WHERE count < quota), so
-- concurrent calls can never exceed the quota. A replayed request finds
-- its row by (transport, client, request_id) and counts nothing new. A free
-- call moves no money: it has no call, payment or journal entry. Rows are
-- written once and never changed or deleted.
CREATE TABLE free_uses (
	id         INTEGER PRIMARY KEY,
	transport  TEXT    NOT NULL CHECK (transport <> ''),
	-- who the quota counts: a client identity, or for anonymous clients
	-- 'source:' and their address
	client     TEXT    NOT NULL CHECK (client <> ''),
	request_id TEXT    NOT NULL CHECK (request_id <> ''),
	server     TEXT    NOT NULL CHECK (server <> ''),
	tool       TEXT    NOT NULL CHECK (tool <> ''),
	day        TEXT    NOT NULL CHECK (day GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9]'), -- UTC, YYYY-MM-DD
	created_at INTEGER NOT NULL,
	UNIQUE (transport, client, request_id)
);
CREATE INDEX free_uses_count ON free_uses (transport, client, server, tool, day);

CREATE TRIGGER free_uses_immutable
BEFORE UPDATE ON free_uses
BEGIN
	SELECT RAISE(ABORT, 'capvend: free uses are immutable');
END;

CREATE TRIGGER free_uses_no_delete
BEFORE DELETE ON free_uses
BEGIN
	SELECT RAISE(ABORT, 'capvend: free uses are never deleted');
END;
