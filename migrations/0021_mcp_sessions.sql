-- capvend ledger, schema 21: MCP HTTP sessions shared by the instances.
--
-- With several capvend instances on one ledger, a session one instance
-- issued is accepted by every other (a client whose instance died fetches
-- its call's stored answer from another). Only the SHA-256 of a session
-- id is kept (hex), with when it expires if idle; a session is written
-- at its first request after initialize and again when half its idle
-- time has passed, and ended by DELETE. Expired rows are deleted.
CREATE TABLE mcp_sessions (
	id_hash    TEXT    PRIMARY KEY CHECK (length(id_hash) = 64),
	expires_at INTEGER NOT NULL
);

CREATE INDEX mcp_sessions_by_expiry ON mcp_sessions (expires_at);
