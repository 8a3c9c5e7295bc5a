package ledger

import (
	"bufio"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/capvend/capvend/vend"
)

// Export formats.
const (
	FormatCSV       = "csv"       // one row per posting, with a header
	FormatJSONL     = "jsonl"     // one JSON object per entry
	FormatBeancount = "beancount" // a file bean-check accepts
	FormatHledger   = "hledger"   // a journal hledger reads
)

// Formats lists the export formats.
var Formats = []string{FormatCSV, FormatJSONL, FormatBeancount, FormatHledger}

// ExportOptions select what Export writes.
type ExportOptions struct {
	Format string
	Since  time.Time // entries at or after (zero: from the beginning)
	Until  time.Time // entries before (zero: to the end)
}

// Export streams the journal's sealed entries in the chosen format to w, in
// entry order, from one consistent snapshot. Memory stays constant in the
// number of entries: rows are formatted as they are read and only the
// postings of the current entry (and a few batches of rows in flight) are
// held.
//
// Two readers run in parallel on two connections, entries and postings,
// each in id order, and the caller's goroutine merges and formats: postings
// of entry n always have smaller ids than postings of entry n+1, because an
// entry and its postings are written in one transaction, writes are
// serialized and nothing is ever deleted (the merge checks this and fails
// rather than misattribute a posting). The postings reader takes its
// snapshot after the entries reader took its own, so it sees every posting
// of every entry the entries reader sees; postings of entries committed in
// between belong to entries that are never read and are skipped. Rows are
// read through the driver directly: database/sql's per-row overhead would
// cost more than SQLite's own work.
func (l *Ledger) Export(ctx context.Context, w io.Writer, opts ExportOptions) error {
	var f exporter
	switch opts.Format {
	case FormatCSV:
		f = &csvExporter{}
	case FormatJSONL:
		f = &jsonlExporter{}
	case FormatBeancount:
		f = &beancountExporter{}
	case FormatHledger:
		f = &hledgerExporter{}
	default:
		return fmt.Errorf("export: unknown format %q (want one of %s)", opts.Format, strings.Join(Formats, ", "))
	}
	since, until := int64(math.MinInt64), int64(math.MaxInt64)
	if !opts.Since.IsZero() {
		since = ms(opts.Since)
	}
	if !opts.Until.IsZero() {
		until = ms(opts.Until)
	}
	if err := l.export(ctx, w, f, since, until); err != nil {
		return fmt.Errorf("export %s: %w", opts.Format, err)
	}
	return nil
}

const exportBatch = 1024 // rows per batch handed from a reader to the merge

type entryRow struct {
	id, ts, call, payment int64
	kind, desc            string
}

type postingRow struct{ entry, account, amount int64 }

// postingsQuery reads postings in id order from the first posting of the
// first entry in range. Every step is an index seek or a scan that stops at
// its first row: a min() over a join here would read the whole journal.
const postingsQuery = `SELECT entry_id, account_id, amount_msat FROM postings
	WHERE id >= coalesce((SELECT p.id FROM postings p WHERE p.entry_id = (
		SELECT e.id FROM entries e WHERE e.sealed = 1 AND +e.ts >= ? AND +e.ts < ? ORDER BY e.id LIMIT 1)
		ORDER BY p.id LIMIT 1), 9223372036854775807)
	ORDER BY id`

func (l *Ledger) export(ctx context.Context, w io.Writer, f exporter, since, until int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var accts *accountSet
	entries := make(chan []entryRow, 4)
	postings := make(chan []postingRow, 4)
	entrySnapshot := make(chan struct{})
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(entries)
		err := l.readRaw(ctx, func(query rawQuery) error {
			var err error
			if accts, err = loadAccounts(query); err != nil {
				return err
			}
			// mattn steps once inside Query: the snapshot is taken
			// when Query returns.
			rows, err := query(`SELECT id, ts, kind, description, coalesce(call_id, 0), coalesce(payment_id, 0)
				FROM entries WHERE sealed = 1 AND +ts >= ? AND +ts < ? ORDER BY id`, []driver.Value{since, until})
			close(entrySnapshot)
			if err != nil {
				return err
			}
			defer rows.Close()
			v := make([]driver.Value, 6)
			return sendBatches(ctx, rows, v, entries, func(b []entryRow) []entryRow {
				return append(b, entryRow{id: v[0].(int64), ts: v[1].(int64), kind: v[2].(string),
					desc: v[3].(string), call: v[4].(int64), payment: v[5].(int64)})
			})
		})
		if err != nil {
			errs <- err
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		defer close(postings)
		select {
		case <-entrySnapshot:
		case <-ctx.Done():
			return
		}
		err := l.readRaw(ctx, func(query rawQuery) error {
			rows, err := query(postingsQuery, []driver.Value{since, until})
			if err != nil {
				return err
			}
			defer rows.Close()
			v := make([]driver.Value, 3)
			return sendBatches(ctx, rows, v, postings, func(b []postingRow) []postingRow {
				return append(b, postingRow{v[0].(int64), v[1].(int64), v[2].(int64)})
			})
		})
		if err != nil {
			errs <- err
			cancel()
		}
	}()
	err := l.merge(ctx, w, f, &accts, entrySnapshot, entries, postings)
	cancel()
	// Drain so the readers can finish, then report the first error.
	go func() {
		for range entries {
		}
	}()
	for range postings {
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		if err == nil || errors.Is(err, context.Canceled) {
			err = e
		}
	}
	return err
}

// rawQuery runs a query on a driver connection, without database/sql's
// per-row conversions.
type rawQuery func(query string, args []driver.Value) (driver.Rows, error)

// readRaw runs fn on a read connection's driver connection inside a read
// transaction (PostgreSQL: repeatable read, a snapshot as SQLite's).
func (l *Ledger) readRaw(ctx context.Context, fn func(query rawQuery) error) error {
	conn, err := l.rdb.Conn(ctx)
	if err != nil {
		return l.fileError(err)
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		switch c := dc.(type) {
		case *sqlite3.SQLiteConn:
			if _, err := c.Exec("BEGIN", nil); err != nil {
				return l.fileError(err)
			}
			defer c.Exec("ROLLBACK", nil)
			return fn(c.Query)
		case *pgConn:
			tx, err := c.BeginTx(ctx, driver.TxOptions{Isolation: driver.IsolationLevel(sql.LevelRepeatableRead), ReadOnly: true})
			if err != nil {
				return l.fileError(err)
			}
			defer tx.Rollback()
			return fn(func(query string, args []driver.Value) (driver.Rows, error) {
				named := make([]driver.NamedValue, len(args))
				for i, a := range args {
					named[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
				}
				return c.QueryContext(ctx, query, named)
			})
		default:
			return fmt.Errorf("unexpected driver connection %T", dc)
		}
	})
}

// sendBatches reads rows into batches of exportBatch and sends them. The
// driver is given no context (checking one on every row costs more than the
// row); ctx is checked once per batch.
func sendBatches[T any](ctx context.Context, rows driver.Rows, v []driver.Value, out chan<- []T, add func([]T) []T) error {
	for {
		b := make([]T, 0, exportBatch)
		for len(b) < exportBatch {
			err := rows.Next(v)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			b = add(b)
		}
		if len(b) > 0 {
			select {
			case out <- b:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if len(b) < exportBatch {
			return nil
		}
	}
}

// merge pairs entries with their postings and formats them.
func (l *Ledger) merge(ctx context.Context, w io.Writer, f exporter, accts **accountSet, snapshot <-chan struct{},
	entries <-chan []entryRow, postings <-chan []postingRow) error {
	select {
	case <-snapshot:
	case <-ctx.Done():
		return ctx.Err()
	}
	if *accts == nil {
		return nil // the entries reader failed; its error is reported
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	if err := f.begin(bw, *accts); err != nil {
		return err
	}
	var pb []postingRow
	pi := 0
	lastEntry := int64(0)
	var cur exportEntry
	for eb := range entries {
		for _, e := range eb {
			cur.id, cur.ts, cur.kind, cur.desc, cur.call, cur.payment = e.id, e.ts, e.kind, e.desc, e.call, e.payment
			cur.postings = cur.postings[:0]
			for {
				if pi == len(pb) {
					var ok bool
					if pb, ok = <-postings; !ok {
						break
					}
					pi = 0
				}
				p := pb[pi]
				if p.entry < lastEntry {
					return fmt.Errorf("postings are not in entry order (entry %d after %d): run 'capvend ledger verify'", p.entry, lastEntry)
				}
				lastEntry = p.entry
				if p.entry > cur.id {
					break // belongs to a later entry
				}
				pi++
				if p.entry < cur.id {
					continue // an entry outside the range
				}
				a, ok := (*accts).byID[p.account]
				if !ok {
					return fmt.Errorf("posting of entry %d names unknown account %d", p.entry, p.account)
				}
				cur.postings = append(cur.postings, exportPosting{acct: a, amount: vend.Msat(p.amount)})
			}
			if len(cur.postings) < 2 {
				if err := ctx.Err(); err != nil {
					return err
				}
				return fmt.Errorf("entry %d has %d postings: run 'capvend ledger verify'", cur.id, len(cur.postings))
			}
			if err := f.entry(bw, &cur); err != nil {
				return err
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return bw.Flush()
}

type exportAccount struct {
	id        int64
	name      string // capvend's name, e.g. income:tools:demo:echo
	typ       string
	beancount string // the Beancount name, e.g. Income:Tools:Demo:Echo
	created   int64
}

type accountSet struct {
	byID    map[int64]*exportAccount
	ordered []*exportAccount
}

func loadAccounts(query rawQuery) (*accountSet, error) {
	rows, err := query("SELECT id, name, type, created_at FROM accounts ORDER BY id", nil)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	s := &accountSet{byID: map[int64]*exportAccount{}}
	taken := map[string]bool{}
	v := make([]driver.Value, 4)
	for {
		if err := rows.Next(v); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		a := &exportAccount{id: v[0].(int64), name: v[1].(string), typ: v[2].(string), created: v[3].(int64)}
		a.beancount = beancountName(a.name)
		if taken[a.beancount] {
			// Two capvend names that differ only in characters
			// Beancount cannot spell: keep them apart by id.
			a.beancount += "-" + strconv.FormatInt(a.id, 10)
		}
		taken[a.beancount] = true
		s.byID[a.id] = a
		s.ordered = append(s.ordered, a)
	}
	return s, nil
}

// beancountName maps an account name to Beancount's rules: capitalised
// components of letters, digits and '-', each starting with a capital or a
// digit.
func beancountName(name string) string {
	segs := strings.Split(name, ":")
	for i, s := range segs {
		b := []byte(s)
		for j, c := range b {
			if c == '.' || c == '_' {
				b[j] = '-'
			}
		}
		switch {
		case len(b) == 0:
			b = []byte("X")
		case b[0] >= 'a' && b[0] <= 'z':
			b[0] -= 'a' - 'A'
		case b[0] == '-':
			b = append([]byte("X"), b...)
		}
		segs[i] = string(b)
	}
	return strings.Join(segs, ":")
}

type exportPosting struct {
	acct   *exportAccount
	amount vend.Msat
}

type exportEntry struct {
	id, ts, call, payment int64
	kind, desc            string
	postings              []exportPosting
}

type exporter interface {
	begin(w *bufio.Writer, accts *accountSet) error
	entry(w *bufio.Writer, e *exportEntry) error
}

// appendTime appends ts (unix ms) as RFC 3339 UTC with milliseconds.
func appendTime(b []byte, ts int64) []byte {
	return time.UnixMilli(ts).UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
}

func appendDate(b []byte, ts int64) []byte {
	return time.UnixMilli(ts).UTC().AppendFormat(b, "2006-01-02")
}

// --- CSV ---

type csvExporter struct {
	buf []byte
}

func (x *csvExporter) begin(w *bufio.Writer, _ *accountSet) error {
	_, err := w.WriteString("entry,time,kind,account,amount_msat,call,payment,description\n")
	return err
}

func (x *csvExporter) entry(w *bufio.Writer, e *exportEntry) error {
	// The part after the account is the same for every posting.
	head := strconv.AppendInt(x.buf[:0], e.id, 10)
	head = append(head, ',')
	head = appendTime(head, e.ts)
	head = append(head, ',')
	head = appendCSV(head, e.kind)
	head = append(head, ',')
	n := len(head)
	for _, p := range e.postings {
		line := appendCSV(head[:n], p.acct.name)
		line = append(line, ',')
		line = strconv.AppendInt(line, int64(p.amount), 10)
		line = append(line, ',')
		if e.call != 0 {
			line = strconv.AppendInt(line, e.call, 10)
		}
		line = append(line, ',')
		if e.payment != 0 {
			line = strconv.AppendInt(line, e.payment, 10)
		}
		line = append(line, ',')
		line = appendCSV(line, e.desc)
		line = append(line, '\n')
		if _, err := w.Write(line); err != nil {
			return err
		}
		head = line
	}
	x.buf = head
	return nil
}

// appendCSV appends s as an RFC 4180 field.
func appendCSV(b []byte, s string) []byte {
	if !strings.ContainsAny(s, ",\"\r\n") {
		return append(b, s...)
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			b = append(b, '"')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// --- JSONL ---

type jsonlExporter struct {
	buf []byte
}

func (x *jsonlExporter) begin(*bufio.Writer, *accountSet) error { return nil }

func (x *jsonlExporter) entry(w *bufio.Writer, e *exportEntry) error {
	b := append(x.buf[:0], `{"entry":`...)
	b = strconv.AppendInt(b, e.id, 10)
	b = append(b, `,"time":"`...)
	b = appendTime(b, e.ts)
	b = append(b, `","kind":`...)
	b = strconv.AppendQuote(b, e.kind)
	b = append(b, `,"description":`...)
	b = appendJSONString(b, e.desc)
	if e.call != 0 {
		b = append(b, `,"call":`...)
		b = strconv.AppendInt(b, e.call, 10)
	}
	if e.payment != 0 {
		b = append(b, `,"payment":`...)
		b = strconv.AppendInt(b, e.payment, 10)
	}
	b = append(b, `,"postings":[`...)
	for i, p := range e.postings {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"account":`...)
		b = appendJSONString(b, p.acct.name)
		b = append(b, `,"amount_msat":`...)
		b = strconv.AppendInt(b, int64(p.amount), 10)
		b = append(b, '}')
	}
	b = append(b, "]}\n"...)
	x.buf = b
	_, err := w.Write(b)
	return err
}

// appendJSONString appends s as a JSON string (RFC 8259 escapes; invalid
// UTF-8 is replaced by U+FFFD as encoding/json does).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r < 0x20 || r == 0x2028 || r == 0x2029:
			b = append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
		default:
			b = append(b, string(r)...)
		}
	}
	return append(b, '"')
}

// --- Beancount ---

type beancountExporter struct {
	buf []byte
}

const commodity = "SAT"

func (x *beancountExporter) begin(w *bufio.Writer, accts *accountSet) error {
	b := append(x.buf[:0], "; capvend ledger export. Amounts are sats with millisatoshi precision.\n"...)
	b = append(b, "option \"title\" \"capvend ledger\"\noption \"operating_currency\" \""+commodity+"\"\n\n"...)
	if len(accts.ordered) > 0 {
		b = appendDate(b, accts.ordered[0].created)
		b = append(b, " commodity "+commodity+"\n  name: \"satoshi\"\n\n"...)
	}
	for _, a := range accts.ordered {
		b = appendDate(b, a.created)
		b = append(b, " open "...)
		b = append(b, a.beancount...)
		b = append(b, " "+commodity+"\n  capvend_account: "...)
		b = appendBeanString(b, a.name)
		b = append(b, '\n')
	}
	x.buf = b
	_, err := w.Write(b)
	return err
}

func (x *beancountExporter) entry(w *bufio.Writer, e *exportEntry) error {
	b := append(x.buf[:0], '\n')
	b = appendDate(b, e.ts)
	b = append(b, ` * "capvend" `...)
	b = appendBeanString(b, e.desc)
	b = append(b, "\n  capvend_entry: "...)
	b = strconv.AppendInt(b, e.id, 10)
	b = append(b, "\n  capvend_kind: "...)
	b = appendBeanString(b, e.kind)
	b = append(b, "\n  capvend_time: "...)
	b = append(b, '"')
	b = appendTime(b, e.ts)
	b = append(b, '"', '\n')
	if e.call != 0 {
		b = append(b, "  capvend_call: "...)
		b = strconv.AppendInt(b, e.call, 10)
		b = append(b, '\n')
	}
	b = appendPostings(b, e.postings, "  ", true)
	x.buf = b
	_, err := w.Write(b)
	return err
}

// appendPostings appends one line per posting: indent, the account (its
// Beancount name or capvend's), and the amount in sats.
func appendPostings(b []byte, ps []exportPosting, indent string, beancount bool) []byte {
	for _, p := range ps {
		b = append(b, indent...)
		if beancount {
			b = append(b, p.acct.beancount...)
		} else {
			b = append(b, p.acct.name...)
		}
		b = append(b, "  "...)
		b = p.amount.AppendSats(b)
		b = append(b, " "+commodity+"\n"...)
	}
	return b
}

// appendBeanString appends s as a Beancount string literal.
func appendBeanString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n', '\r':
			b = append(b, ' ')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// --- hledger ---

type hledgerExporter struct {
	buf []byte
}

func (x *hledgerExporter) begin(w *bufio.Writer, accts *accountSet) error {
	b := append(x.buf[:0], "; capvend ledger export. Amounts are sats with millisatoshi precision.\n"...)
	b = append(b, "decimal-mark .\ncommodity 1000.000 "+commodity+"\n\n"...)
	for _, a := range accts.ordered {
		b = append(b, "account "...)
		b = append(b, a.name...)
		b = append(b, "  ; type: "...)
		b = append(b, hledgerType(a.typ)...)
		b = append(b, '\n')
	}
	x.buf = b
	_, err := w.Write(b)
	return err
}

func hledgerType(t string) string {
	switch t {
	case "assets":
		return "A"
	case "liabilities":
		return "L"
	case "equity":
		return "E"
	case "income":
		return "R"
	default:
		return "X"
	}
}

func (x *hledgerExporter) entry(w *bufio.Writer, e *exportEntry) error {
	b := append(x.buf[:0], '\n')
	b = appendDate(b, e.ts)
	b = append(b, " * "...)
	b = appendHledgerText(b, e.desc, false)
	b = append(b, "  ; entry:"...)
	b = strconv.AppendInt(b, e.id, 10)
	b = append(b, ", kind:"...)
	b = appendHledgerText(b, e.kind, true)
	if e.call != 0 {
		b = append(b, ", call:"...)
		b = strconv.AppendInt(b, e.call, 10)
	}
	b = append(b, '\n')
	b = appendPostings(b, e.postings, "    ", false)
	x.buf = b
	_, err := w.Write(b)
	return err
}

// appendHledgerText appends s with the characters that would end or split an
// hledger description (';', '|', line breaks) replaced by spaces; in a tag
// value, ',' too.
func appendHledgerText(b []byte, s string, tag bool) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == ';' || c == '|' || c == '\n' || c == '\r' || c == '\t' || (tag && c == ',') {
			c = ' '
		}
		b = append(b, c)
	}
	return b
}
