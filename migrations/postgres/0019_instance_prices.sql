-- capvend ledger, schema 19, PostgreSQL (see ../0019_instance_prices.sql).
CREATE TABLE instance_prices (
	instance      TEXT   PRIMARY KEY CHECK (instance <> ''),
	price_hash    TEXT   NOT NULL CHECK (length(price_hash) = 64),
	registered_at BIGINT NOT NULL
);
