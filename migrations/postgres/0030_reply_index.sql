-- capvend ledger, schema 30: one index fewer to write per stored reply.
--
-- request_replies had two indexes on created_at: request_replies_created
-- (every row: deleting the replies past two windows) and
-- request_replies_unpruned (the rows whose body is kept: the result
-- retention, schema 24). A reply is stored by a Nostr front for each
-- free call, and each one wrote a page of both. Replies past two windows
-- are now deleted through request_replies_unpruned and, for the few
-- whose body was pruned already, request_replies_pruned, which a reply
-- being stored (pruned_at NULL) never touches.
CREATE INDEX request_replies_pruned ON request_replies (created_at) WHERE pruned_at IS NOT NULL;
DROP INDEX request_replies_created;
