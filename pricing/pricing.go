// Package pricing holds capvend's money type and its price book: what each
// tool, prompt and resource costs, how a call's price follows from its
// arguments, and how a price is shown in tool lists and `cap` tags.
//
// # What it owns
//
// Msat, the money type: prices are integers throughout, and all
// arithmetic saturates at MaxPrice, so no argument can make a price
// negative or overflow. A Rule prices one tool: a base price per call,
// optionally plus a price per unit of one argument (Per: see Kind for how
// each kind counts), clamped to [Min, Max]. A Book holds the rules by
// server and item: it quotes a call (Quote), says what an item without a
// rule is (Unpriced: free, or refused: not offered at all), orders the
// resource templates matching a URI from the most specific
// (CompareSpecificity: the most literal characters, then the fewest
// expressions), and checks its rules against what an upstream lists
// (Unmatched: a rule naming nothing is a configuration error, since the
// item it meant would go without it).
//
// A rule without a Max is capped at MaxPrice (21 million bitcoin): its
// listed range is then "lo-2100000000000000" sats, so configurations
// should give per-argument rules a Max (capvend's config requires one).
//
// Prices and Entry are rules as a configuration states them (amounts in
// sats or msat, at most one per-argument price, a flat price only for
// prompts and resources): Prices.Rules turns them into rules, and
// Prices.Check reports what is wrong with them, naming the key.
//
// # How it fits
//
// It is a leaf: it imports nothing of capvend. vend quotes with it (its
// PriceBook), adapters/ctxvm writes its cap tags with CapAmount,
// adapters/upstream reports what it lists as a Listing, and internal/cli
// builds the Book from the configuration.
// docs/OPERATING.md, Prices, says how an operator sets prices.
package pricing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/yosida95/uritemplate/v3"
)

// MaxPrice is the highest price any rule can produce: 21 million bitcoin
// in millisatoshis. It is the cap of a rule without Max, and the ceiling
// saturating arithmetic stops at.
const MaxPrice Msat = 21_000_000 * 100_000_000 * MsatPerSat

// Kind is what a per-argument price counts:
//
//   - PerUnit: a numeric argument, counted in whole units. A fractional
//     value is rounded up (2.5 units cost 3); the number is read exactly
//     from its JSON text, never through a float. A negative number is an
//     error; a huge one counts as "very many" (the price saturates and is
//     clamped to the maximum).
//   - PerKB: a string argument, counted in started KB of 1024 bytes of its
//     UTF-8 encoding (1 byte .. 1024 bytes is 1 KB; "" is 0 KB).
//   - PerItem: an array argument, counted in elements.
//
// An argument whose name differs from the priced one only in case (as Go's
// encoding/json folds names: strings.EqualFold, with the Kelvin sign and
// the long s) is refused with ErrBadArgument: an upstream matching names
// without regard to case would read it as the priced argument.
//
// A missing argument, or one that is JSON null, counts 0: the price is then
// the base price (raised to Min). The schema's default is not consulted:
// the upstream, not capvend, applies defaults, and a default the client
// did not send costs nothing. An argument of the wrong JSON type is an
// error (ErrBadArgument), which capvend answers with JSON-RPC -32602
// invalid params.
type Kind string

// The kinds of per-argument prices.
const (
	PerUnit Kind = "unit" // a numeric argument, per whole unit (fractions rounded up)
	PerKB   Kind = "kb"   // a string argument, per started 1024 bytes of UTF-8
	PerItem Kind = "item" // an array argument, per element
)

// Per is the argument-based part of a price: Price for each Kind of unit
// found in the top-level argument Arg.
type Per struct {
	Kind  Kind
	Arg   string // the argument's name in the call's arguments object
	Price Msat   // per unit; > 0
}

// Rule prices one tool: Price + count(Per) × Per.Price, clamped to
// [Min, Max]. The zero Rule is free.
type Rule struct {
	Price Msat // base price per call
	Per   *Per // optional per-argument price
	Min   Msat // the least a call costs (0: no minimum)
	Max   Msat // the most a call costs (0: MaxPrice)
	// FreePerDay calls per client and UTC day are free (counted by the
	// caller, see Quote.FreePerDay); 0: none.
	FreePerDay int
	// FreePerDayTotal bounds the free calls of the tool per UTC day
	// across all clients (fresh Nostr keys cost nothing, so a per-client
	// quota alone gives away unlimited calls); 0: no such bound. Only
	// meaningful with FreePerDay.
	FreePerDayTotal int
	// NotIdempotent tools are refunded, never re-run, after capvend was
	// interrupted while they ran.
	NotIdempotent bool
}

// Validate reports the first thing wrong with r: a negative amount, an
// amount above MaxPrice, Min above Max, a base price above Max, a Per
// without argument name, kind or a positive price, a negative FreePerDay
// or FreePerDayTotal, a FreePerDay on a free tool, or a FreePerDayTotal
// without a FreePerDay.
func (r Rule) Validate() error {
	for _, a := range []struct {
		name string
		v    Msat
	}{{"price", r.Price}, {"min", r.Min}, {"max", r.Max}} {
		if a.v < 0 {
			return fmt.Errorf("%s is negative", a.name)
		}
		if a.v > MaxPrice {
			return fmt.Errorf("%s is more than 21 million bitcoin", a.name)
		}
	}
	if r.Max > 0 && r.Min > r.Max {
		return fmt.Errorf("min %s is above max %s", fmtMsat(r.Min), fmtMsat(r.Max))
	}
	if r.Max > 0 && r.Price > r.Max {
		return fmt.Errorf("price %s is above max %s", fmtMsat(r.Price), fmtMsat(r.Max))
	}
	if p := r.Per; p != nil {
		switch p.Kind {
		case PerUnit, PerKB, PerItem:
		default:
			return fmt.Errorf("unknown per-argument kind %q (want %s, %s or %s)", p.Kind, PerUnit, PerKB, PerItem)
		}
		if p.Arg == "" {
			return errors.New("a per-argument price needs the argument's name")
		}
		if p.Price <= 0 {
			return errors.New("a per-argument price must be positive")
		}
		if p.Price > MaxPrice {
			return errors.New("per-argument price is more than 21 million bitcoin")
		}
	}
	if r.FreePerDay < 0 {
		return fmt.Errorf("free calls per day is negative (%d)", r.FreePerDay)
	}
	if r.FreePerDay > 0 && r.free() {
		return errors.New("free calls per day on a tool that is free anyway")
	}
	if r.FreePerDayTotal < 0 {
		return fmt.Errorf("free calls per day in all is negative (%d)", r.FreePerDayTotal)
	}
	if r.FreePerDayTotal > 0 && r.FreePerDay == 0 {
		return errors.New("free calls per day in all without free calls per client")
	}
	return nil
}

func (r *Rule) free() bool { return r.Price == 0 && r.Per == nil && r.Min == 0 }

// ceiling is the most r can cost.
func (r *Rule) ceiling() Msat {
	if r.Max > 0 {
		return r.Max
	}
	return MaxPrice
}

// clamp puts p into [Min, ceiling].
func (r *Rule) clamp(p Msat) Msat {
	if p < r.Min {
		p = r.Min
	}
	if c := r.ceiling(); p > c {
		p = c
	}
	return p
}

// Quote is the price of one call and how it came about.
type Quote struct {
	Price      Msat // 0: free
	Idempotent bool // the tool may be re-run after a crash during execution
	// FreePerDay is the tool's daily free quota per client: when > 0 and
	// Price > 0, the caller may serve the call free if the client has
	// used fewer than FreePerDay free calls of this tool today (UTC).
	FreePerDay int
	// FreePerDayTotal, when > 0, bounds those free calls per UTC day
	// across all clients.
	FreePerDayTotal int
	// Description says how the price was computed, for people: "21 sat
	// per call", "3 KB of text × 2 sat/KB + 1 sat = 7 sat".
	Description string
}

// ErrBadArgument: an argument a price depends on has the wrong JSON type
// or a nonsensical value (a negative count). The caller answers with
// invalid params; nothing is quoted.
var ErrBadArgument = errors.New("bad argument")

// Book is a set of rules by upstream server and tool name (or PromptKey,
// ResourceKey). A tool, prompt or resource without a rule is free, or,
// for a server the book refuses unpriced items of (WithUnpriced), not
// offered at all (see Unpriced). A Book is immutable once built, so it is
// safe for concurrent use; a new configuration builds a new Book.
type Book struct {
	rules map[string]map[string]Rule
	// templates are, by server, the priced resource keys that are URI
	// templates (see ResourceTemplates), the most specific first.
	templates map[string][]pricedTemplate
	// unpriced is, by server, what an item without a rule is; absent:
	// UnpricedFree.
	unpriced map[string]Unpriced
}

// Unpriced is what a Book makes of an item it has no rule for.
type Unpriced string

// What an item without a rule is.
const (
	// UnpricedFree: offered free, like an item whose rule is free (the
	// default).
	UnpricedFree Unpriced = "free"
	// UnpricedRefuse: not offered: neither listed nor sold. An item is
	// offered free by a rule of its own that is free.
	UnpricedRefuse Unpriced = "refuse"
)

// Option configures NewBook.
type Option func(*Book)

// WithUnpriced sets what items without a rule are, by server (a server
// not in byServer: UnpricedFree).
func WithUnpriced(byServer map[string]Unpriced) Option {
	return func(b *Book) {
		for s, u := range byServer {
			if u == UnpricedRefuse {
				if b.unpriced == nil {
					b.unpriced = map[string]Unpriced{}
				}
				b.unpriced[s] = u
			}
		}
	}
}

// pricedTemplate is a priced resource URI template and what its URIs match.
type pricedTemplate struct {
	template string
	re       *regexp.Regexp
}

// NewBook builds a book from rules[server][tool]. It fails, naming the
// tool, if a rule does not Validate.
func NewBook(rules map[string]map[string]Rule, opts ...Option) (*Book, error) {
	b := &Book{rules: map[string]map[string]Rule{}}
	for _, o := range opts {
		o(b)
	}
	for server, tools := range rules {
		m := make(map[string]Rule, len(tools))
		for tool, r := range tools {
			if err := r.Validate(); err != nil {
				return nil, fmt.Errorf("price of %s/%s: %w", server, tool, err)
			}
			if r.Per != nil {
				p := *r.Per // the book must not share the caller's Per
				r.Per = &p
			}
			m[tool] = r
			if tpl, ok := strings.CutPrefix(tool, resourcePrefix); ok && strings.Contains(tpl, "{") {
				if ut, err := uritemplate.New(tpl); err == nil {
					if b.templates == nil {
						b.templates = map[string][]pricedTemplate{}
					}
					b.templates[server] = append(b.templates[server], pricedTemplate{template: tpl, re: ut.Regexp()})
				}
			}
		}
		b.rules[server] = m
		slices.SortFunc(b.templates[server], func(a, b pricedTemplate) int { return CompareSpecificity(a.template, b.template) })
	}
	return b, nil
}

// Unpriced returns what an item of server without a rule is.
func (b *Book) Unpriced(server string) Unpriced {
	if u, ok := b.unpriced[server]; ok {
		return u
	}
	return UnpricedFree
}

// RefusesUnpriced reports whether Unpriced is UnpricedRefuse for any
// server.
func (b *Book) RefusesUnpriced() bool { return len(b.unpriced) > 0 }

// Has reports whether the book has a rule for key (a tool name,
// PromptKey, ResourceKey) on server, a free one included.
func (b *Book) Has(server, key string) bool {
	_, ok := b.rules[server][key]
	return ok
}

// ResourceTemplates returns the URI templates the book prices resources of
// server by (ResourceKey of a template) that uri matches, the most
// specific first (see CompareSpecificity); nil if none. A template the
// uritemplate package cannot parse matches nothing.
func (b *Book) ResourceTemplates(server, uri string) []string {
	var out []string
	for _, t := range b.templates[server] {
		if t.re.MatchString(uri) {
			out = append(out, t.template)
		}
	}
	return out
}

// PromptKey and ResourceKey are the names under which a Book holds the
// rules of prompts and resources, beside its tools: "prompt:<name>" and
// "resource:<uri or URI template>". MCP tool names have no ':' (their
// recommended alphabet is A-Z a-z 0-9 _ - .), so the three never collide;
// capvend's config refuses tool names with these prefixes.
func PromptKey(name string) string { return promptPrefix + name }

// ResourceKey: see PromptKey.
func ResourceKey(uri string) string { return resourcePrefix + uri }

const (
	promptPrefix   = "prompt:"
	resourcePrefix = "resource:"
)

// Quote prices a call of tool on server with args (a JSON object; empty or
// null means no arguments). It returns an error wrapping ErrBadArgument if
// an argument the price depends on is not of the rule's kind or is
// negative, or args is not an object; it never returns a negative price or
// one above the rule's Max.
func (b *Book) Quote(server, tool string, args json.RawMessage) (Quote, error) {
	r, ok := b.rules[server][tool]
	if !ok || r.free() {
		return Quote{Idempotent: !r.NotIdempotent, Description: "free"}, nil
	}
	q := Quote{Idempotent: !r.NotIdempotent, FreePerDay: r.FreePerDay, FreePerDayTotal: r.FreePerDayTotal}
	if r.Per == nil {
		q.Price = r.clamp(r.Price)
		q.Description = fmtMsat(q.Price) + " per call"
		return q, nil
	}
	n, err := count(r.Per, args)
	if err != nil {
		return Quote{}, err
	}
	raw := satAdd(r.Price, satMul(n, r.Per.Price))
	q.Price = r.clamp(raw)
	var d strings.Builder
	ns := strconv.FormatUint(n, 10)
	if n == ^uint64(0) {
		ns = "over " + ns // saturated: the argument was larger still
	}
	fmt.Fprintf(&d, "%s %s of %s × %s/%s", ns, unitName(r.Per.Kind, n), r.Per.Arg, fmtMsat(r.Per.Price), unitName(r.Per.Kind, 1))
	if r.Price > 0 {
		d.WriteString(" + " + fmtMsat(r.Price))
	}
	d.WriteString(" = " + fmtMsat(raw))
	if q.Price != raw {
		d.WriteString(clampNote(&r, q.Price))
	}
	q.Description = d.String()
	return q, nil
}

func clampNote(r *Rule, p Msat) string {
	if p == r.Min {
		return ", raised to the minimum " + fmtMsat(p)
	}
	return ", capped at " + fmtMsat(p)
}

func unitName(k Kind, n uint64) string {
	name := map[Kind]string{PerUnit: "unit", PerKB: "KB", PerItem: "item"}[k]
	if n != 1 && k != PerKB {
		name += "s"
	}
	return name
}

// Listed returns the lowest and highest price a call can cost, for lists
// and announcements (before any free quota): equal for a flat price; for a
// per-argument rule, lo is the price of a call without the argument and hi
// the rule's Max (MaxPrice if it has none).
func (b *Book) Listed(server, tool string) (lo, hi Msat) {
	r := b.rules[server][tool]
	lo = r.clamp(r.Price)
	if r.Per == nil {
		return lo, lo
	}
	return lo, r.ceiling()
}

// CapAmount renders a listed price as the amount of a ["cap", ...] tag, in
// sats rounded up: "21", or "10-50" when the price varies (when both ends
// round to the same sats, just that: "1").
func CapAmount(lo, hi Msat) string {
	l, h := lo.SatsCeil(), hi.SatsCeil()
	if l == h {
		return strconv.FormatInt(l, 10)
	}
	return strconv.FormatInt(l, 10) + "-" + strconv.FormatInt(h, 10)
}

// count returns how many of p's units args hold.
func count(p *Per, args json.RawMessage) (uint64, error) {
	args = bytes.TrimSpace(args)
	if len(args) == 0 || string(args) == "null" {
		return 0, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil {
		return 0, fmt.Errorf("%w: arguments must be a JSON object", ErrBadArgument)
	}
	for k := range m {
		// An upstream that reads its arguments into a Go struct (or a
		// .NET model) takes "TEXT", "Text" or "ſ"/"K" spellings for the
		// argument priced: such a key would escape its price.
		if k != p.Arg && strings.EqualFold(k, p.Arg) {
			return 0, fmt.Errorf("%w: argument %q is a case variant of the priced argument %q: send it as %q", ErrBadArgument, k, p.Arg, p.Arg)
		}
	}
	v := bytes.TrimSpace(m[p.Arg])
	if len(v) == 0 || string(v) == "null" {
		return 0, nil
	}
	switch p.Kind {
	case PerKB:
		var s string
		if v[0] != '"' || json.Unmarshal(v, &s) != nil {
			return 0, fmt.Errorf("%w: %s must be a string", ErrBadArgument, p.Arg)
		}
		return (uint64(len(s)) + 1023) / 1024, nil
	case PerItem:
		var items []json.RawMessage
		if v[0] != '[' || json.Unmarshal(v, &items) != nil {
			return 0, fmt.Errorf("%w: %s must be an array", ErrBadArgument, p.Arg)
		}
		return uint64(len(items)), nil
	case PerUnit:
		n, err := ceilUnits(string(v))
		if err != nil {
			return 0, fmt.Errorf("%w: %s %v", ErrBadArgument, p.Arg, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: unknown kind %q", ErrBadArgument, p.Kind)
}

// ceilUnits reads a JSON number exactly and returns it rounded up to a
// whole number, saturating at MaxUint64. Negative numbers are an error
// (-0 is 0).
func ceilUnits(s string) (uint64, error) {
	i := 0
	neg := false
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intPart := s[start:i]
	if intPart == "" || len(intPart) > 1 && intPart[0] == '0' {
		return 0, errors.New("must be a number")
	}
	var frac string
	if i < len(s) && s[i] == '.' {
		i++
		fs := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		frac = s[fs:i]
		if frac == "" {
			return 0, errors.New("must be a number")
		}
	}
	exp := int64(0)
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		es := i
		for i < len(s) && isDigit(s[i]) {
			if exp < 1<<20 { // beyond this the value is 0<x<1 or huge either way
				exp = exp*10 + int64(s[i]-'0')
			}
			i++
		}
		if i == es {
			return 0, errors.New("must be a number")
		}
		if eneg {
			exp = -exp
		}
	}
	if i != len(s) {
		return 0, errors.New("must be a number")
	}
	// value = digits × 10^(exp - len(frac)), digits without leading zeros.
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return 0, nil // zero, also -0
	}
	if neg {
		return 0, errors.New("must not be negative")
	}
	e := exp - int64(len(frac))
	whole, rest := digits, ""
	switch {
	case e >= 0:
		if int64(len(digits))+e > 20 {
			return ^uint64(0), nil
		}
		whole += strings.Repeat("0", int(e))
	case int64(len(digits))+e <= 0:
		return 1, nil // 0 < value < 1
	default:
		cut := int64(len(digits)) + e
		whole, rest = digits[:cut], digits[cut:]
	}
	n, err := strconv.ParseUint(whole, 10, 64)
	if err != nil {
		return ^uint64(0), nil // out of range: saturate
	}
	if strings.Trim(rest, "0") != "" && n < ^uint64(0) {
		n++
	}
	return n, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// satMul returns n × p, saturating at MaxPrice; p is not negative.
func satMul(n uint64, p Msat) Msat {
	if p <= 0 || n == 0 {
		return 0
	}
	hi, lo := bits.Mul64(n, uint64(p))
	if hi != 0 || lo > uint64(MaxPrice) {
		return MaxPrice
	}
	return Msat(lo)
}

// satAdd returns a + b, saturating at MaxPrice; both are in [0, MaxPrice].
func satAdd(a, b Msat) Msat {
	if a > MaxPrice-b {
		return MaxPrice
	}
	return a + b
}

// fmtMsat formats an amount for people: "7 sat", "0.5 sat".
func fmtMsat(m Msat) string {
	s := string(m.AppendSats(nil))
	s = strings.TrimRight(s, "0")
	s = strings.TrimSuffix(s, ".")
	return s + " sat"
}
