-- capvend ledger, schema 2, PostgreSQL (see ../0002_hold_preimages.sql).
CREATE TABLE hold_preimages (
	payment_id BIGINT PRIMARY KEY REFERENCES payments (id),
	preimage   BYTEA  NOT NULL CHECK (length(preimage) = 32)
);

CREATE TRIGGER hold_preimages_immutable BEFORE UPDATE ON hold_preimages
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: preimages are immutable');

INSERT INTO payment_transitions (from_state, to_state) VALUES
	('expired', 'settled'),
	('canceled', 'settled');
