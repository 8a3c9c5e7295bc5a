-- capvend ledger, schema 29, PostgreSQL (see ../0029_lost_payments.sql):
-- the ledger's identity, and payments a restored ledger lost.
CREATE TABLE ledger_identity (
	id   INTEGER PRIMARY KEY CHECK (id = 1),
	mark BYTEA   NOT NULL CHECK (length(mark) = 32)
);
INSERT INTO ledger_identity (id, mark)
	VALUES (1, uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));

CREATE TRIGGER ledger_identity_immutable BEFORE UPDATE ON ledger_identity
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: the ledger identity never changes');

CREATE TRIGGER ledger_identity_no_delete BEFORE DELETE ON ledger_identity
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: the ledger identity never changes');

CREATE TRIGGER ledger_identity_no_truncate BEFORE TRUNCATE ON ledger_identity
FOR EACH STATEMENT EXECUTE FUNCTION capvend_refuse('capvend: the ledger identity never changes');

CREATE TABLE lost_payments (
	ref         TEXT   PRIMARY KEY CHECK (ref <> ''),
	backend     TEXT   NOT NULL CHECK (backend IN ('lnd', 'cashu')),
	mint_url    TEXT   NOT NULL DEFAULT '' CHECK ((backend = 'cashu') = (mint_url <> '')),
	account     TEXT   NOT NULL CHECK (account LIKE 'assets:%'), -- where the money landed
	amount_msat BIGINT NOT NULL CHECK (amount_msat > 0),
	entry_id    BIGINT NOT NULL UNIQUE REFERENCES entries (id),
	found_at    BIGINT NOT NULL
);

CREATE TRIGGER lost_payments_immutable BEFORE UPDATE ON lost_payments
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: a lost payment, once booked, is immutable');

CREATE TRIGGER lost_payments_no_delete BEFORE DELETE ON lost_payments
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: a lost payment, once booked, is immutable');

CREATE TRIGGER lost_payments_no_truncate BEFORE TRUNCATE ON lost_payments
FOR EACH STATEMENT EXECUTE FUNCTION capvend_refuse('capvend: a lost payment, once booked, is immutable');
