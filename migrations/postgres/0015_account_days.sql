-- capvend ledger, schema 15, PostgreSQL (see ../0015_account_days.sql):
-- per account and UTC day, the sum of the sealed postings and how many
-- sealed settlement entries posted to it, kept by a trigger at seal.
CREATE TABLE account_days (
	day         TEXT   NOT NULL CHECK (day ~ '^[0-9]{4}-[0-1][0-9]-[0-3][0-9]$'), -- UTC, YYYY-MM-DD
	account_id  BIGINT NOT NULL REFERENCES accounts (id),
	amount_msat BIGINT NOT NULL,
	settlements BIGINT NOT NULL CHECK (settlements >= 0),
	PRIMARY KEY (day, account_id)
);

CREATE FUNCTION account_days_on_seal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO account_days AS a (day, account_id, amount_msat, settlements)
	SELECT to_char(to_timestamp(NEW.ts / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD'), p.account_id,
		sum(p.amount_msat), CASE WHEN NEW.kind = 'settlement' THEN 1 ELSE 0 END
	FROM postings p WHERE p.entry_id = NEW.id GROUP BY p.account_id
	ON CONFLICT (day, account_id) DO UPDATE SET
		amount_msat = a.amount_msat + excluded.amount_msat,
		settlements = a.settlements + excluded.settlements;
	RETURN NULL;
END $$;

CREATE TRIGGER account_days_on_seal AFTER UPDATE OF sealed ON entries
FOR EACH ROW WHEN (OLD.sealed = 0 AND NEW.sealed = 1)
EXECUTE FUNCTION account_days_on_seal();

CREATE TRIGGER account_days_no_delete BEFORE DELETE ON account_days
FOR EACH ROW EXECUTE FUNCTION capvend_refuse('capvend: account days are never deleted');

CREATE TRIGGER account_days_no_truncate BEFORE TRUNCATE ON account_days
FOR EACH STATEMENT EXECUTE FUNCTION capvend_refuse('capvend: account days are never deleted');

-- The journal written before this schema.
INSERT INTO account_days (day, account_id, amount_msat, settlements)
SELECT to_char(to_timestamp(e.ts / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, p.account_id, sum(p.amount_msat),
	count(DISTINCT CASE WHEN e.kind = 'settlement' THEN e.id END)
FROM postings p JOIN entries e ON e.id = p.entry_id
WHERE e.sealed = 1 GROUP BY 1, p.account_id;

-- A call's history page lists the differences found about it.
CREATE INDEX reconcile_differences_call ON reconcile_differences (call_id) WHERE call_id IS NOT NULL;
