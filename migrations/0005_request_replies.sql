-- capvend ledger, schema 5: the answers to Nostr requests, by event id.
--
-- A Nostr request is one signed event; relays may deliver it again (to a
-- restarted server too) while its created_at is inside the server's
-- window. Its answer is kept here so a replay is answered from it and
-- never served twice. Priced calls are also found by their call record;
-- this table covers every request that ran something (free calls,
-- prompts, resources). Not money: rows past the window are pruned.
CREATE TABLE request_replies (
	request_key TEXT    PRIMARY KEY, -- transport-qualified request id
	reply       BLOB    NOT NULL,    -- the JSON-RPC answer, as sent
	created_at  INTEGER NOT NULL     -- unix ms
) WITHOUT ROWID;

CREATE INDEX request_replies_created ON request_replies (created_at);
