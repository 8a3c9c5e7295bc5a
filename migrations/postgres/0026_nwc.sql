-- capvend ledger, schema 26: payments into a wallet reached by Nostr
-- Wallet Connect (see ../0026_nwc.sql). PostgreSQL widens the CHECKs in
-- place.
ALTER TABLE payments DROP CONSTRAINT payments_backend_check;
ALTER TABLE payments ADD CONSTRAINT payments_backend_check CHECK (backend IN ('lnd', 'cashu', 'nwc')
	OR (backend ~ '^nwc:[a-z0-9_-]+$' AND length(backend) <= 68));
ALTER TABLE payments DROP CONSTRAINT payments_kind_check;
ALTER TABLE payments ADD CONSTRAINT payments_kind_check
	CHECK (kind IN ('invoice', 'hold_invoice', 'mint_quote', 'token', 'wallet_invoice'));
-- An NWC connection's payments are its invoices: plain (wallet) or hold.
ALTER TABLE payments ADD CONSTRAINT payments_nwc_kind
	CHECK (backend NOT LIKE 'nwc%' OR kind IN ('wallet_invoice', 'hold_invoice'));
ALTER TABLE payments ADD CONSTRAINT payments_wallet_invoice_nwc
	CHECK (kind <> 'wallet_invoice' OR backend LIKE 'nwc%');

ALTER TABLE reconcile_differences DROP CONSTRAINT reconcile_differences_backend_check;
ALTER TABLE reconcile_differences ADD CONSTRAINT reconcile_differences_backend_check
	CHECK (backend IN ('lnd', 'cashu', 'nwc') OR (backend ~ '^nwc:[a-z0-9_-]+$' AND length(backend) <= 68));
