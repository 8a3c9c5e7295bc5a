// Package migrations holds the ledger's schema as numbered SQL files,
// embedded into the binary. The ledger package applies them in order, each in
// its own transaction, and records what it applied. The ledger is
// append-only: there are no down migrations, and a file, once released, is
// never edited (add a new number instead).
package migrations

import "embed"

// FS holds the migration files, named NNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
