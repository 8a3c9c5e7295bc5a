-- capvend ledger, schema 20: unpaid-request limits counted in the ledger.
--
-- With several capvend instances on one ledger, each counts a client's
-- open unpaid payment requests (limits.max_unpaid_per_client) across all
-- of them: a call keeps the key its limits count (vend's limit key: an
-- address, a client id a proxy vouched for, a Nostr pubkey), and the
-- open payments of the awaiting calls of that key are counted. '' when
-- nothing counts it (one instance): such calls stay out of the index, so
-- a single instance pays nothing for it.
ALTER TABLE calls ADD COLUMN limit_key TEXT NOT NULL DEFAULT '';

CREATE INDEX calls_unpaid_key ON calls (limit_key)
	WHERE limit_key <> '' AND state = 'awaiting_payment';
