-- capvend ledger, schema 14: reconciliation of the books with LND and the
-- Cashu wallet and mints.
--
-- A reconciliation run compares what the payment backends hold with the
-- ledger. Every difference it finds is a row here, so the operator can list
-- them (capvend reconcile, the dashboard), with what was repaired: a repair
-- is written in the same transaction as the payment state change it made,
-- so a difference marked repaired was repaired, and one that was not is
-- not. Runs and differences are append-only: a run is written when it
-- starts and finished once.

-- How far the reconciler has compared a source's invoices: every invoice of
-- the LND node with an add index at or below add_index was final (settled
-- or canceled) and agreed with the ledger when it was last compared.
CREATE TABLE reconcile_cursors (
	source     TEXT    PRIMARY KEY CHECK (source <> ''),
	add_index  INTEGER NOT NULL CHECK (add_index >= 0),
	updated_at INTEGER NOT NULL
);

CREATE TABLE reconcile_runs (
	id          INTEGER PRIMARY KEY,
	started_at  INTEGER NOT NULL,
	finished_at INTEGER,
	differences INTEGER NOT NULL DEFAULT 0 CHECK (differences >= 0),
	repaired    INTEGER NOT NULL DEFAULT 0 CHECK (repaired >= 0 AND repaired <= differences),
	error       TEXT    NOT NULL DEFAULT ''
);

CREATE TABLE reconcile_differences (
	id        INTEGER PRIMARY KEY,
	run_id    INTEGER NOT NULL REFERENCES reconcile_runs (id),
	kind      TEXT    NOT NULL CHECK (kind IN (
		'settled_unbooked', 'booked_unsettled', 'canceled_unbooked', 'orphan_hold',
		'cashu_balance', 'mint_quote')),
	backend   TEXT    NOT NULL CHECK (backend IN ('lnd', 'cashu')),
	ref       TEXT    NOT NULL DEFAULT '',
	call_id   INTEGER REFERENCES calls (id),
	mint_url  TEXT    NOT NULL DEFAULT '',
	ledger    TEXT    NOT NULL DEFAULT '', -- what the ledger says
	remote    TEXT    NOT NULL DEFAULT '', -- what LND, the wallet or the mint says
	detail    TEXT    NOT NULL DEFAULT '',
	-- What the reconciler did about it, '' if it is left to the operator.
	repair    TEXT    NOT NULL DEFAULT '',
	found_at  INTEGER NOT NULL
);
CREATE INDEX reconcile_differences_run ON reconcile_differences (run_id);

CREATE TRIGGER reconcile_differences_immutable
BEFORE UPDATE ON reconcile_differences
BEGIN
	SELECT RAISE(ABORT, 'capvend: reconciliation differences are immutable');
END;

CREATE TRIGGER reconcile_differences_append_only
BEFORE DELETE ON reconcile_differences
BEGIN
	SELECT RAISE(ABORT, 'capvend: reconciliation differences are append-only');
END;

CREATE TRIGGER reconcile_runs_finish_once
BEFORE UPDATE ON reconcile_runs
WHEN OLD.finished_at IS NOT NULL
BEGIN
	SELECT RAISE(ABORT, 'capvend: a reconciliation run is finished once');
END;

CREATE TRIGGER reconcile_runs_append_only
BEFORE DELETE ON reconcile_runs
BEGIN
	SELECT RAISE(ABORT, 'capvend: reconciliation runs are append-only');
END;
