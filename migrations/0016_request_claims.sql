-- capvend ledger, schema 16: requests claimed by one capvend instance.
--
-- Several instances sharing one ledger (PostgreSQL) with one Nostr key all
-- receive every request. Each claims a request's key (its Nostr event id)
-- here before answering it; the first INSERT wins (ON CONFLICT DO NOTHING,
-- checked by rows affected), and the others drop the request. A claim is
-- kept while its request could still arrive (twice the Nostr window), then
-- pruned.
CREATE TABLE request_claims (
	request_key TEXT    PRIMARY KEY CHECK (request_key <> ''),
	holder      TEXT    NOT NULL CHECK (holder <> ''),
	claimed_at  INTEGER NOT NULL
);

CREATE INDEX request_claims_by_time ON request_claims (claimed_at);
