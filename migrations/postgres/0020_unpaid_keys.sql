-- capvend ledger, schema 20, PostgreSQL (see ../0020_unpaid_keys.sql).
ALTER TABLE calls ADD COLUMN limit_key TEXT NOT NULL DEFAULT '';

CREATE INDEX calls_unpaid_key ON calls (limit_key)
	WHERE limit_key <> '' AND state = 'awaiting_payment';
