-- capvend ledger, schema 18: rate limits counted in the ledger.
--
-- With several capvend instances on one ledger, a client's calls per
-- minute (limits.requests_per_minute) are counted here, so that the limit
-- holds across instances: one row per client and minute (its start, unix
-- ms), incremented by an upsert that only goes through below the limit.
-- Rows of past minutes are deleted.
CREATE TABLE rate_counts (
	client TEXT    NOT NULL CHECK (client <> ''),
	minute INTEGER NOT NULL,
	calls  INTEGER NOT NULL CHECK (calls > 0),
	PRIMARY KEY (client, minute)
);

CREATE INDEX rate_counts_by_minute ON rate_counts (minute);
