-- capvend ledger, schema 2: hold invoices and late payments.
--
-- capvend makes the preimage of each hold invoice it issues, and needs it to
-- settle the invoice after the tool succeeded, also after a restart. It is
-- written in the same transaction as the payment. A preimage is a bearer
-- secret for that one invoice: it is never exported or logged.
CREATE TABLE hold_preimages (
	payment_id INTEGER PRIMARY KEY REFERENCES payments (id),
	preimage   BLOB    NOT NULL CHECK (length(preimage) = 32)
);

CREATE TRIGGER hold_preimages_immutable
BEFORE UPDATE ON hold_preimages
BEGIN
	SELECT RAISE(ABORT, 'capvend: preimages are immutable');
END;

-- A Cashu mint quote cannot be withdrawn: its invoice stays payable at the
-- mint after capvend gave up on it. Money that arrives late is still
-- capvend's to record: the payment becomes settled, its call stays expired
-- or canceled (it never runs), and the amount is booked as owed back
-- (liabilities:refunds). Only mint quotes take these edges (checked in Go).
INSERT INTO payment_transitions (from_state, to_state) VALUES
	('expired', 'settled'),
	('canceled', 'settled');
