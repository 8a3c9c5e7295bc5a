package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/capvend/capvend/ledger"
)

// open opens the ledger c names: the SQLite file
// ledger.path (db, if set, overrides it), or with ledger.driver postgres
// the database whose DSN ledger.dsn_file holds. The DSN is read here and
// goes nowhere but to the driver: no error or log line quotes it.
func (c LedgerConfig) open(ctx context.Context, db string, opts ledger.Options) (*ledger.Ledger, error) {
	if c.Driver != "postgres" || db != "" {
		path := c.Path
		if db != "" {
			path = db
		}
		return ledger.Open(ctx, path, opts)
	}
	if c.DSNFile == "" {
		return nil, errors.New("ledger.dsn_file: required with driver postgres: a file holding the PostgreSQL DSN")
	}
	if err := checkSecretFile("ledger.dsn_file", c.DSNFile); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(c.DSNFile)
	if err != nil {
		return nil, fmt.Errorf("ledger.dsn_file: %w", err)
	}
	dsn := strings.TrimSpace(string(b))
	if dsn == "" {
		return nil, fmt.Errorf("ledger.dsn_file: %s is empty: it must hold the PostgreSQL DSN", c.DSNFile)
	}
	return ledger.OpenPostgres(ctx, dsn, opts)
}
