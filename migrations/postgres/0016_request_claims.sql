-- capvend ledger, schema 16, PostgreSQL (see ../0016_request_claims.sql).
CREATE TABLE request_claims (
	request_key TEXT   PRIMARY KEY CHECK (request_key <> ''),
	holder      TEXT   NOT NULL CHECK (holder <> ''),
	claimed_at  BIGINT NOT NULL
);

CREATE INDEX request_claims_by_time ON request_claims (claimed_at);
