-- capvend ledger, schema 7: a request is bound to exactly what it asked for.
--
-- A request key (transport, client, request id) names one thing: a priced
-- call (calls) or a free use (free_uses). The same key coming back with
-- another kind, tool or arguments is refused (vend.ErrRequestReused), never
-- treated as a replay. Calls record their canonical argument hash since
-- schema 1; free uses record it from now on. A free use recorded before
-- has no hash (NULL) and never matches a replay.
ALTER TABLE free_uses ADD COLUMN args_hash TEXT CHECK (args_hash IS NULL OR length(args_hash) = 64);
