-- capvend ledger, schema 28: refunds and credit paid back from the wallet
-- of an NWC connection (NIP-47 pay_invoice; issue 28).
--
-- A payout (schema 22) may now leave the wallet of a Nostr Wallet Connect
-- connection instead of capvend's Cashu wallet: it pays a bolt11 (method
-- 'bolt11') with the connection's pay_invoice, reserved before the
-- request is sent like a melt. Its mint_url names the connection ('nwc',
-- or 'nwc:<name>'), not a mint: its money leaves
-- assets:lightning:<connection> (where that wallet's income lands), its
-- fee is expenses:fees:<connection>. Its quote is the invoice's payment
-- hash (64 lower-case hex digits), the wallet's key to the payment: a
-- payout left in flight is booked or released from what lookup_invoice
-- says of it. Its wallet names the connection's client key, so that only
-- a process holding that connection resolves it. It reserves no fee (a
-- NIP-47 wallet quotes none) and is never a withdrawal.
--
-- A payment hash pays one payout: the quote index now leaves out released
-- NWC payouts, so that an invoice whose payout was released (the wallet's
-- balance too low, the connection's budget spent) can be paid again,
-- while a payout in flight or booked still holds its payment hash alone.
-- A melt quote still pays one payout, released or not.
DROP INDEX payouts_quote;
CREATE UNIQUE INDEX payouts_quote ON payouts (quote)
	WHERE quote IS NOT NULL AND (state <> 'released' OR mint_url NOT GLOB 'nwc*');

CREATE TRIGGER payouts_nwc
BEFORE INSERT ON payouts
WHEN NEW.mint_url GLOB 'nwc*' AND NOT (NEW.method = 'bolt11' AND NEW.kind IN ('credit', 'refund')
	AND (NEW.mint_url = 'nwc' OR (NEW.mint_url GLOB 'nwc:?*' AND NEW.mint_url NOT GLOB 'nwc:*[^a-z0-9_-]*'
		AND length(NEW.mint_url) <= 68))
	AND coalesce(length(NEW.quote) = 64 AND NEW.quote NOT GLOB '*[^0-9a-f]*', 0)
	AND NEW.invoice <> '' AND NEW.wallet <> '' AND NEW.fee_reserve_msat = 0)
BEGIN
	SELECT RAISE(ABORT, 'capvend: an NWC payout pays a bolt11 by its payment hash, from one named connection');
END;
