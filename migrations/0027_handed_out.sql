-- capvend ledger, schema 27: the ecash capvend's wallet handed out.
--
-- capvend's Cashu wallet derives every proof it makes from its seed
-- (NUT-13), so a wallet rebuilt from the seed ('capvend cashu restore',
-- NUT-09) finds again every proof of its own that is still unspent at
-- the mint: its own ecash, and also the change it handed to clients that
-- they have not redeemed yet. That change is the clients' money: the
-- restore must set it aside, not count or spend it. The refund and payout
-- tokens capvend hands out are in refunds.token and payouts.token; the
-- change of a token payment is recorded here, by the SHA-256 of each
-- proof's secret (never the secret: a record is no bearer secret), when
-- it is made, before it is handed over.
CREATE TABLE cashu_handed_out (
	secret_hash TEXT    PRIMARY KEY CHECK (length(secret_hash) = 64),
	mint_url    TEXT    NOT NULL CHECK (mint_url <> ''),
	amount_sat  INTEGER NOT NULL CHECK (amount_sat > 0),
	kind        TEXT    NOT NULL CHECK (kind IN ('change')),
	ref         TEXT    NOT NULL DEFAULT '', -- the payment the change is of
	created_at  INTEGER NOT NULL
);

CREATE TRIGGER cashu_handed_out_immutable
BEFORE UPDATE ON cashu_handed_out
BEGIN
	SELECT RAISE(ABORT, 'capvend: the record of ecash handed out is immutable');
END;

CREATE TRIGGER cashu_handed_out_no_delete
BEFORE DELETE ON cashu_handed_out
BEGIN
	SELECT RAISE(ABORT, 'capvend: the record of ecash handed out is never deleted');
END;
