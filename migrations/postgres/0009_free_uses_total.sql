-- capvend ledger, schema 9, PostgreSQL (see ../0009_free_uses_total.sql).
CREATE INDEX free_uses_total ON free_uses (server, tool, day);
