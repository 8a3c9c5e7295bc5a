// Package pricing holds capvend's money type and its price book: what each
// tool costs, and how a price is shown in tool lists and `cap` tags. It is
// a leaf: it imports nothing of capvend.
package pricing

import (
	"encoding/json"
	"strconv"
)

// Rule prices one tool.
type Rule struct {
	Price Msat // per call; 0 is free
	// NotIdempotent tools are refunded, never re-run, after capvend was
	// interrupted while they ran.
	NotIdempotent bool
}

// Book is a set of rules by upstream server and tool name. A tool without a
// rule is free. A Book is immutable once built, so it is safe for
// concurrent use; a new configuration builds a new Book.
type Book struct {
	rules map[string]map[string]Rule
}

// NewBook builds a book from rules[server][tool].
func NewBook(rules map[string]map[string]Rule) *Book {
	b := &Book{rules: map[string]map[string]Rule{}}
	for server, tools := range rules {
		m := make(map[string]Rule, len(tools))
		for tool, r := range tools {
			m[tool] = r
		}
		b.rules[server] = m
	}
	return b
}

// Price returns what a call of tool on server with args costs, and whether
// the tool may be re-run after a crash. args are not used by flat prices.
func (b *Book) Price(server, tool string, args json.RawMessage) (Msat, bool, error) {
	r := b.rules[server][tool]
	return r.Price, !r.NotIdempotent, nil
}

// Listed returns the lowest and highest price a call can cost, for lists
// and announcements.
func (b *Book) Listed(server, tool string) (lo, hi Msat) {
	r := b.rules[server][tool]
	return r.Price, r.Price
}

// CapAmount renders a listed price as the amount of a ["cap", ...] tag, in
// sats rounded up: "21", or "10-50" when the price varies.
func CapAmount(lo, hi Msat) string {
	if lo == hi {
		return strconv.FormatInt(lo.SatsCeil(), 10)
	}
	return strconv.FormatInt(lo.SatsCeil(), 10) + "-" + strconv.FormatInt(hi.SatsCeil(), 10)
}
