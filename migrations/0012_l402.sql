-- capvend ledger, schema 12: L402 (bLIP-0026) on the HTTP front.
--
-- l402_root_keys holds the root key every L402 macaroon capvend mints is
-- signed with: 32 random bytes, generated once (the first time one is
-- needed) and never changed, so that a macaroon verifies with no network
-- round trip and survives restarts. Key 1 is the only one today; the id
-- leaves room for a rotation that keeps old tokens verifiable.
CREATE TABLE l402_root_keys (
	id         INTEGER PRIMARY KEY CHECK (id >= 1),
	root_key   BLOB    NOT NULL CHECK (length(root_key) = 32),
	created_at INTEGER NOT NULL
);

CREATE TRIGGER l402_root_keys_immutable
BEFORE UPDATE ON l402_root_keys
BEGIN
	SELECT RAISE(ABORT, 'capvend: L402 root keys are immutable');
END;

CREATE TRIGGER l402_root_keys_append_only
BEFORE DELETE ON l402_root_keys
BEGIN
	SELECT RAISE(ABORT, 'capvend: L402 root keys are append-only');
END;

-- l402_revocations: a token id (hex, from the macaroon's identifier) listed
-- here is refused whatever its signature and preimage say. Append-only: a
-- revocation is never withdrawn.
CREATE TABLE l402_revocations (
	token_id   TEXT    PRIMARY KEY
		CHECK (length(token_id) = 64 AND token_id NOT GLOB '*[^0-9a-f]*'),
	reason     TEXT    NOT NULL,
	created_at INTEGER NOT NULL
);

CREATE TRIGGER l402_revocations_immutable
BEFORE UPDATE ON l402_revocations
BEGIN
	SELECT RAISE(ABORT, 'capvend: L402 revocations are immutable');
END;

CREATE TRIGGER l402_revocations_append_only
BEFORE DELETE ON l402_revocations
BEGIN
	SELECT RAISE(ABORT, 'capvend: L402 revocations are append-only');
END;
