-- capvend ledger, schema 9: a tool's free calls per day across all clients.
--
-- A per-client daily quota gives away unlimited calls to clients whose
-- identities are free (a fresh Nostr key per call). free_per_day_total bounds
-- a tool's free uses of a UTC day across every client and transport; the
-- claim counts them (server, tool, day) in the same transaction as the
-- client's own count, and this index keeps that count cheap.
CREATE INDEX free_uses_total ON free_uses (server, tool, day);
