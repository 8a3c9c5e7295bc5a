-- capvend ledger, schema 11: payment tokens of explicit-gating grants.
--
-- A client that cannot keep an MCP session or set _meta (a stock MCP host:
-- the model retries with an argument) gets, with a payment-required
-- answer, a random token that names its grant: the call it was quoted for.
-- Only the token's SHA-256 is stored. A token belongs to one explicit-gating
-- call (what it releases is exactly that call's binding: kind, server,
-- tool, args hash); it is good while the call is awaiting payment (until
-- expires_at, the invoice's expiry) or paid, and used once the call
-- executes (the call's own exactly-once claim). Written once, never changed.
CREATE TABLE grant_tokens (
	token_hash TEXT    PRIMARY KEY
		CHECK (length(token_hash) = 64 AND token_hash NOT GLOB '*[^0-9a-f]*'),
	call_id    INTEGER NOT NULL REFERENCES calls (id),
	expires_at INTEGER NOT NULL,
	created_at INTEGER NOT NULL
);

CREATE INDEX grant_tokens_call ON grant_tokens (call_id);

CREATE TRIGGER grant_tokens_explicit_only
BEFORE INSERT ON grant_tokens
WHEN NOT EXISTS (SELECT 1 FROM call_arguments WHERE call_id = NEW.call_id AND explicit = 1)
BEGIN
	SELECT RAISE(ABORT, 'capvend: a payment token names an explicit-gating call');
END;

CREATE TRIGGER grant_tokens_immutable
BEFORE UPDATE ON grant_tokens
BEGIN
	SELECT RAISE(ABORT, 'capvend: payment tokens are immutable');
END;

CREATE TRIGGER grant_tokens_append_only
BEFORE DELETE ON grant_tokens
BEGIN
	SELECT RAISE(ABORT, 'capvend: payment tokens are append-only');
END;
