package ledger

import (
	"context"
	"database/sql/driver"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/stdlib"
)

// The PostgreSQL dialect. The ledger's SQL is written once, in the subset
// both engines read (INSERT ... ON CONFLICT, RETURNING, IS NOT DISTINCT
// FROM, CASE, coalesce); what is left is translated here, at the
// database/sql driver boundary, so that no query is written twice:
//
//   - '?' placeholders become $1, $2, ... (rebind);
//   - the few SQLite functions with no common spelling are replaced by
//     their PostgreSQL equivalent, from the exact fragments in pgFragments
//     (a test checks each fragment still occurs in the ledger's source);
//   - a Go bool argument is sent as the integer 0 or 1: the schemas keep
//     flags as 0/1 integers on both engines.

// pgFragments maps SQLite-only SQL fragments to PostgreSQL.
var pgFragments = []struct{ sqlite, postgres string }{
	// balance.go: the UTC day of a millisecond time stamp.
	{`date(e.ts / 1000, 'unixepoch')`, `to_char(to_timestamp(e.ts / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')`},
	// The scalar max of two values (SQLite's max(a, b) is PostgreSQL's greatest).
	{`max(lnd_cursors.add_index, excluded.add_index)`, `greatest(lnd_cursors.add_index, excluded.add_index)`},
	{`max(lnd_cursors.settle_index, excluded.settle_index)`, `greatest(lnd_cursors.settle_index, excluded.settle_index)`},
	{`max(reconcile_cursors.add_index, excluded.add_index)`, `greatest(reconcile_cursors.add_index, excluded.add_index)`},
	{`max(add_index, ?)`, `greatest(add_index, ?)`},
	{`max(settle_index, ?)`, `greatest(settle_index, ?)`},
	// retention.go: a body's SHA-256 (lower-case hex) and size in bytes.
	{`capvend_sha256(body)`, `encode(sha256(body), 'hex')`},
	{`length(CAST(body AS BLOB))`, `octet_length(body)`},
	// verify.go, refunds.go: is a trigger in the schema?
	{`SELECT 1 FROM sqlite_master m WHERE m.type = 'trigger' AND m.name = t.name`,
		`SELECT 1 FROM pg_trigger m WHERE NOT m.tgisinternal AND m.tgname = t.name`},
}

// pgQueries caches the translation of each query text, up to
// maxPGCache of them (a query built with one placeholder per item, such
// as a token's proofs, has as many texts as sizes).
var (
	pgQueries  sync.Map // string -> string
	pgCached   atomic.Int64
	maxPGCache = int64(4096)
)

// pgQuery translates a query of the ledger to PostgreSQL.
func pgQuery(q string) string {
	if v, ok := pgQueries.Load(q); ok {
		return v.(string)
	}
	out := q
	for _, f := range pgFragments {
		out = strings.ReplaceAll(out, f.sqlite, f.postgres)
	}
	out = rebind(out)
	if pgCached.Add(1) <= maxPGCache {
		pgQueries.Store(q, out)
	}
	return out
}

// rebind replaces each '?' placeholder of q by $1, $2, ... (and a
// numbered ?NNN by $NNN), leaving alone
// those inside string literals, quoted identifiers, comments and
// dollar-quoted bodies.
func rebind(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == '?':
			j := i + 1
			for j < len(q) && q[j] >= '0' && q[j] <= '9' {
				j++
			}
			b.WriteByte('$')
			if j > i+1 { // ?NNN names its parameter, as $NNN does
				b.WriteString(q[i+1 : j])
			} else {
				n++
				b.WriteString(strconv.Itoa(n))
			}
			i = j
			continue
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(q) {
				if q[j] == c {
					if j+1 < len(q) && q[j+1] == c { // '' or "" inside
						j += 2
						continue
					}
					break
				}
				j++
			}
			j = min(j+1, len(q))
			b.WriteString(q[i:j])
			i = j
			continue
		case c == '-' && strings.HasPrefix(q[i:], "--"):
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				j = len(q) - i
			}
			b.WriteString(q[i : i+j])
			i += j
			continue
		case c == '/' && strings.HasPrefix(q[i:], "/*"):
			j := strings.Index(q[i+2:], "*/")
			end := len(q)
			if j >= 0 {
				end = i + 2 + j + 2
			}
			b.WriteString(q[i:end])
			i = end
			continue
		case c == '$':
			if tag, ok := dollarTag(q[i:]); ok {
				j := strings.Index(q[i+len(tag):], tag)
				end := len(q)
				if j >= 0 {
					end = i + len(tag) + j + len(tag)
				}
				b.WriteString(q[i:end])
				i = end
				continue
			}
		}
		b.WriteByte(c)
		i++
	}
	return b.String()
}

// dollarTag returns the $tag$ that s starts with, if any.
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '$':
			return s[:j+1], true
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || (j > 1 && c >= '0' && c <= '9'):
		default:
			return "", false
		}
	}
	return "", false
}

// pgConnector opens pgx connections that speak the ledger's dialect.
type pgConnector struct{ base driver.Connector }

func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &pgConn{Conn: dc.(*stdlib.Conn)}, nil
}

func (c pgConnector) Driver() driver.Driver { return c.base.Driver() }

// pgConn is a pgx database/sql connection whose queries are translated by
// pgQuery. Its other methods (transactions, ping, session reset) are
// pgx's.
type pgConn struct{ *stdlib.Conn }

func (c *pgConn) Prepare(q string) (driver.Stmt, error) {
	return c.Conn.Prepare(pgQuery(q))
}

func (c *pgConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, pgQuery(q))
}

func (c *pgConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, pgQuery(q), args)
}

func (c *pgConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, pgQuery(q), args)
}

// CheckNamedValue sends a bool as 0 or 1 (flags are integers in both
// schemas) and passes everything else to pgx as it is.
func (c *pgConn) CheckNamedValue(nv *driver.NamedValue) error {
	if b, ok := nv.Value.(bool); ok {
		nv.Value = int64(0)
		if b {
			nv.Value = int64(1)
		}
	}
	return nil
}
