-- capvend ledger, schema 17: leases of the instances sharing a ledger.
--
-- Work that must run once across the capvend instances sharing a ledger
-- (recovery of interrupted calls, reconciliation) is done by the holder of
-- a lease; each instance also holds a lease on its own run, which tells the
-- others it is alive. A lease is taken or renewed in one statement (an
-- upsert that only goes through when the lease is free, expired or already
-- the taker's), so a dead holder's lease is taken over once it expires.
CREATE TABLE leases (
	name       TEXT    PRIMARY KEY CHECK (name <> ''),
	holder     TEXT    NOT NULL CHECK (holder <> ''),
	expires_at INTEGER NOT NULL
);
