-- capvend ledger, schema 19: the price book of each instance sharing the
-- ledger.
--
-- Prices come from each instance's configuration. An instance records the
-- hash of its price book here at start, after comparing it with those of
-- the live instances (holding their run's lease, or registered within the
-- lease's time): one whose prices differ is refused, so that instances
-- never sell the same tool at two prices. A reload (SIGHUP) updates the
-- row. Rows of dead instances are deleted.
CREATE TABLE instance_prices (
	instance      TEXT    PRIMARY KEY CHECK (instance <> ''),
	price_hash    TEXT    NOT NULL CHECK (length(price_hash) = 64),
	registered_at INTEGER NOT NULL
);
