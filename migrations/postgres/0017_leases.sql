-- capvend ledger, schema 17, PostgreSQL (see ../0017_leases.sql).
CREATE TABLE leases (
	name       TEXT   PRIMARY KEY CHECK (name <> ''),
	holder     TEXT   NOT NULL CHECK (holder <> ''),
	expires_at BIGINT NOT NULL
);
