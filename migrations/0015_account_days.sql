-- capvend ledger, schema 15: what each account moved on each day, kept as
-- the journal is written, for the operator's dashboard.
--
-- The dashboard shows revenue per tool (ever) and per day. Summing the
-- postings for that reads every income posting at each page load: on a
-- ledger of a million postings, too slow for a page that refreshes itself.
-- account_days holds, per account and UTC day, the sum of the sealed
-- postings and how many sealed settlement entries posted to it: a trigger
-- adds each entry's postings when the entry is sealed (entries are sealed
-- once, and postings never change afterwards), in the same transaction, so
-- the table never disagrees with the journal (ledger verify checks it).
-- A page then reads (accounts x days) rows, not postings.
CREATE TABLE account_days (
	day         TEXT    NOT NULL CHECK (day GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9]'), -- UTC, YYYY-MM-DD
	account_id  INTEGER NOT NULL REFERENCES accounts (id),
	amount_msat INTEGER NOT NULL,
	-- sealed settlement entries with a posting to the account
	settlements INTEGER NOT NULL CHECK (settlements >= 0),
	PRIMARY KEY (day, account_id)
) WITHOUT ROWID;

CREATE TRIGGER account_days_on_seal
AFTER UPDATE OF sealed ON entries
WHEN OLD.sealed = 0 AND NEW.sealed = 1
BEGIN
	INSERT INTO account_days (day, account_id, amount_msat, settlements)
	SELECT date(NEW.ts / 1000, 'unixepoch'), p.account_id, sum(p.amount_msat), NEW.kind = 'settlement'
	FROM postings p WHERE p.entry_id = NEW.id GROUP BY p.account_id
	ON CONFLICT (day, account_id) DO UPDATE SET
		amount_msat = amount_msat + excluded.amount_msat,
		settlements = settlements + excluded.settlements;
END;

CREATE TRIGGER account_days_no_delete
BEFORE DELETE ON account_days
BEGIN
	SELECT RAISE(ABORT, 'capvend: account days are never deleted');
END;

-- The journal written before this schema.
INSERT INTO account_days (day, account_id, amount_msat, settlements)
SELECT date(e.ts / 1000, 'unixepoch') AS day, p.account_id, sum(p.amount_msat),
	count(DISTINCT CASE WHEN e.kind = 'settlement' THEN e.id END)
FROM postings p JOIN entries e ON e.id = p.entry_id
WHERE e.sealed = 1 GROUP BY day, p.account_id;

-- A call's history page lists the differences found about it.
CREATE INDEX reconcile_differences_call ON reconcile_differences (call_id) WHERE call_id IS NOT NULL;
