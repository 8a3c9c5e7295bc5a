-- capvend ledger, schema 18, PostgreSQL (see ../0018_rate_counts.sql).
CREATE TABLE rate_counts (
	client TEXT   NOT NULL CHECK (client <> ''),
	minute BIGINT NOT NULL,
	calls  BIGINT NOT NULL CHECK (calls > 0),
	PRIMARY KEY (client, minute)
);

CREATE INDEX rate_counts_by_minute ON rate_counts (minute);
