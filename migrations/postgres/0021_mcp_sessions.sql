-- capvend ledger, schema 21, PostgreSQL (see ../0021_mcp_sessions.sql).
CREATE TABLE mcp_sessions (
	id_hash    TEXT   PRIMARY KEY CHECK (length(id_hash) = 64),
	expires_at BIGINT NOT NULL
);

CREATE INDEX mcp_sessions_by_expiry ON mcp_sessions (expires_at);
