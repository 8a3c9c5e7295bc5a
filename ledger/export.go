package ledger

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

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
// postings of the current entry are held.
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
	since, until := int64(0), int64(1<<62)
	if !opts.Since.IsZero() {
		since = ms(opts.Since)
	}
	if !opts.Until.IsZero() {
		until = ms(opts.Until)
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	err := l.read(ctx, func(tx *sql.Tx) error {
		accts, err := loadAccounts(ctx, tx)
		if err != nil {
			return err
		}
		if err := f.begin(bw, accts); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT e.id, e.ts, e.kind, e.description, coalesce(e.call_id, 0),
			coalesce(e.payment_id, 0), p.account_id, p.amount_msat
			FROM entries e JOIN postings p ON p.entry_id = e.id
			WHERE e.sealed = 1 AND e.ts >= ? AND e.ts < ?
			ORDER BY e.id, p.id`, since, until)
		if err != nil {
			return err
		}
		defer rows.Close()
		var cur exportEntry
		var id, ts, call, payment, acct, amount int64
		var kind, desc sql.RawBytes
		for rows.Next() {
			if err := rows.Scan(&id, &ts, &kind, &desc, &call, &payment, &acct, &amount); err != nil {
				return err
			}
			if id != cur.id {
				if cur.id != 0 {
					if err := f.entry(bw, &cur); err != nil {
						return err
					}
				}
				cur = exportEntry{id: id, ts: ts, kind: string(kind), desc: string(desc), call: call, payment: payment, postings: cur.postings[:0]}
			}
			a, ok := accts.byID[acct]
			if !ok {
				return fmt.Errorf("export: posting of entry %d names unknown account %d", id, acct)
			}
			cur.postings = append(cur.postings, exportPosting{acct: a, amount: vend.Msat(amount)})
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if cur.id != 0 {
			if err := f.entry(bw, &cur); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("export %s: %w", opts.Format, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("export %s: %w", opts.Format, err)
	}
	return nil
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

func loadAccounts(ctx context.Context, tx *sql.Tx) (*accountSet, error) {
	rows, err := tx.QueryContext(ctx, "SELECT id, name, type, created_at FROM accounts ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	s := &accountSet{byID: map[int64]*exportAccount{}}
	taken := map[string]bool{}
	for rows.Next() {
		a := &exportAccount{}
		if err := rows.Scan(&a.id, &a.name, &a.typ, &a.created); err != nil {
			return nil, err
		}
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
	return s, rows.Err()
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
	for _, p := range e.postings {
		b = append(b, "  "...)
		b = append(b, p.acct.beancount...)
		b = append(b, "  "...)
		b = p.amount.AppendSats(b)
		b = append(b, " "+commodity+"\n"...)
	}
	x.buf = b
	_, err := w.Write(b)
	return err
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
	for _, p := range e.postings {
		b = append(b, "    "...)
		b = append(b, p.acct.name...)
		b = append(b, "  "...)
		b = p.amount.AppendSats(b)
		b = append(b, " "+commodity+"\n"...)
	}
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
