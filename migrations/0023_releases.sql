-- capvend ledger, schema 23: every execution records who released its
-- call (vend.Release, issue 26).
--
-- A way to pay (vend.Schemes) is bearer (whoever holds the credential:
-- a Cashu token, a payment token, an L402 macaroon, a credit token) or
-- bound (only the client the call was quoted to: its session, Nostr key
-- or stdio). Each execution from now on records the scheme that released
-- its call, and the transport and client of the request that presented
-- the credential ('' for a request without an identity); 'ledger verify'
-- checks that a bound scheme released only its own client's call.
-- Executions recorded before have no release (NULL): this migration does
-- not guess one.
ALTER TABLE executions ADD COLUMN released_by TEXT CHECK (released_by IS NULL OR released_by <> '');
ALTER TABLE executions ADD COLUMN released_transport TEXT;
ALTER TABLE executions ADD COLUMN released_client TEXT;

CREATE TRIGGER executions_released
BEFORE INSERT ON executions
WHEN NEW.backfilled = 0 AND (NEW.released_by IS NULL OR NEW.released_transport IS NULL OR NEW.released_client IS NULL)
BEGIN
	SELECT RAISE(ABORT, 'capvend: an execution records the scheme, transport and client that released its call');
END;
