// Package migrations holds the ledger's schema as numbered SQL files,
// embedded into the binary. The ledger package applies them in order, each in
// its own transaction, and records what it applied. The ledger is
// append-only: there are no down migrations, and a file, once released, is
// never edited (add a new number instead).
//
// The SQLite schema is NNNN_description.sql at the top; the PostgreSQL
// schema is postgres/NNNN_description.sql, with the same numbers, names
// and money rules (CHECKs, triggers) in PostgreSQL's dialect. A new
// migration is written for both engines.
package migrations

import "embed"

// FS holds the migration files: NNNN_description.sql for SQLite, and
// postgres/NNNN_description.sql for PostgreSQL.
//
//go:embed *.sql postgres/*.sql
var FS embed.FS
