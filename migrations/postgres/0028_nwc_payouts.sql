-- capvend ledger, schema 28, PostgreSQL (see ../0028_nwc_payouts.sql):
-- payouts from the wallet of an NWC connection.
DROP INDEX payouts_quote;
CREATE UNIQUE INDEX payouts_quote ON payouts (quote)
	WHERE quote IS NOT NULL AND (state <> 'released' OR mint_url NOT LIKE 'nwc%');

CREATE TRIGGER payouts_nwc BEFORE INSERT ON payouts
FOR EACH ROW WHEN (NEW.mint_url LIKE 'nwc%' AND NOT (NEW.method = 'bolt11' AND NEW.kind IN ('credit', 'refund')
	AND (NEW.mint_url = 'nwc' OR (NEW.mint_url ~ '^nwc:[a-z0-9_-]+$' AND length(NEW.mint_url) <= 68))
	AND coalesce(NEW.quote ~ '^[0-9a-f]{64}$', false)
	AND NEW.invoice <> '' AND NEW.wallet <> '' AND NEW.fee_reserve_msat = 0))
EXECUTE FUNCTION capvend_refuse('capvend: an NWC payout pays a bolt11 by its payment hash, from one named connection');
