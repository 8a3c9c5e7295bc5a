package cli

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// priceCheck holds the prices in force to what the upstreams list. A
// price that names no tool, prompt or resource its upstream lists (a
// typo, or an item renamed upstream) would leave the item it meant sold
// free, or, with unpriced: refuse, not sold at all, so it is an error.
// Upstreams connect in the background and may be down at start, so an
// upstream's prices are checked when its lists arrive:
//
//   - the first time they arrive (at start, or whenever an upstream that
//     was down connects): serve stops with the error (Run returns it);
//   - on SIGHUP, against the lists of every upstream listed so far: the
//     reload is refused and the old prices stay (checkPrices);
//   - when a listed upstream's lists change later (list_changed, a
//     reconnect to a changed server): the error is logged and /readyz
//     is not ready, but serve goes on selling, as stopping would end
//     every upstream's sales over one upstream's change. Its items
//     without a price meanwhile follow pricing.unpriced.
//
// A list that could not be fetched is not checked; a resource price that
// is a URI template names what it matches (see pricing.Book.Unmatched).
type priceCheck struct {
	listings func() map[string]pricing.Listing
	log      *slog.Logger
	fatal    chan error // the first first-list mismatch (capacity 1)

	mu      sync.Mutex
	cfg     *Config
	book    *pricing.Book
	checked map[string]bool // upstreams whose first lists were checked
	failed  bool            // a first-list mismatch was found
	stale   []string        // mismatches found after the first lists, for /readyz
	// pending are a reload's prices, checked, until they are set.
	pending     *Config
	pendingBook *pricing.Book
}

func newPriceCheck(cfg *Config, book *pricing.Book, listings func() map[string]pricing.Listing, log *slog.Logger) *priceCheck {
	return &priceCheck{listings: listings, log: log, fatal: make(chan error, 1), cfg: cfg, book: book, checked: map[string]bool{}}
}

// unmatchedPrices names, as configuration keys, the prices of cfg (whose
// book is book) that name nothing their upstream lists in ls, for the
// upstreams for which only says true (nil: all).
func unmatchedPrices(cfg *Config, book *pricing.Book, ls map[string]pricing.Listing, only func(string) bool) []string {
	var out []string
	for i, u := range cfg.Upstreams {
		l, ok := ls[u.Name]
		if !ok || only != nil && !only(u.Name) {
			continue
		}
		for _, key := range book.Unmatched(u.Name, l) {
			out = append(out, fmt.Sprintf("upstreams[%d].%s: upstream %s lists no such %s", i, configKey(key), u.Name, itemWord(key)))
		}
	}
	return out
}

// configKey is the configuration key of a price book key:
// "tools.<name>", "prompts.<name>", "resources.<uri>".
func configKey(key string) string {
	if name, ok := strings.CutPrefix(key, pricing.PromptKey("")); ok {
		return "prompts." + name
	}
	if uri, ok := strings.CutPrefix(key, pricing.ResourceKey("")); ok {
		return "resources." + uri
	}
	return "tools." + key
}

func itemWord(key string) string {
	switch {
	case strings.HasPrefix(key, pricing.PromptKey("")):
		return "prompt"
	case strings.HasPrefix(key, pricing.ResourceKey("")):
		return "resource, nor a template matching it"
	}
	return "tool"
}

// priceError is the error of prices naming nothing.
func priceError(unmatched []string) error {
	return fmt.Errorf("%s (a typo, or renamed upstream? the item meant would go without its price: free, or with unpriced: refuse not sold)",
		strings.Join(unmatched, "; "))
}

// listed checks the lists that arrived (upstream.Config.OnChange): an
// upstream's first lists against the prices in force, fatally; the
// lists of upstreams checked before, for /readyz and the log.
func (pc *priceCheck) listed() {
	ls := pc.listings()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	first := map[string]bool{}
	for name := range ls {
		if !pc.checked[name] {
			first[name] = true
			pc.checked[name] = true
		}
	}
	if bad := unmatchedPrices(pc.cfg, pc.book, ls, func(s string) bool { return first[s] }); len(bad) > 0 {
		pc.failed = true
		select {
		case pc.fatal <- priceError(bad):
		default:
		}
	}
	pc.recheckLocked(ls, first)
}

// recheckLocked recomputes the mismatches of the upstreams checked before
// (not in first) and logs them when they change. pc.mu is held.
func (pc *priceCheck) recheckLocked(ls map[string]pricing.Listing, first map[string]bool) {
	stale := unmatchedPrices(pc.cfg, pc.book, ls, func(s string) bool { return pc.checked[s] && !first[s] })
	if slices.Equal(stale, pc.stale) {
		return
	}
	pc.stale = stale
	if len(stale) > 0 {
		pc.log.Error("an upstream's lists changed, and a price names nothing it lists: fix the prices and reload (SIGHUP)", "err", priceError(stale))
	} else {
		pc.log.Info("every price names an item its upstream lists again")
	}
}

// checkPrices refuses the prices of next (book) if one names nothing an
// upstream listed so far lists (reloadPrices); else they are pending
// until set (see checkedVendor).
func (pc *priceCheck) checkPrices(next *Config, book *pricing.Book) error {
	if bad := unmatchedPrices(next, book, pc.listings(), nil); len(bad) > 0 {
		return priceError(bad)
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.pending, pc.pendingBook = next, book
	return nil
}

// inForce makes the pending prices, if they are book, those checked
// from now on.
func (pc *priceCheck) inForce(book vend.PriceBook) {
	ls := pc.listings()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.pending == nil || vend.PriceBook(pc.pendingBook) != book {
		return
	}
	pc.cfg, pc.book = pc.pending, pc.pendingBook
	pc.pending, pc.pendingBook = nil, nil
	pc.recheckLocked(ls, nil)
}

// Run returns the first first-list mismatch, or nil when ctx ends.
func (pc *priceCheck) Run(ctx context.Context) error {
	select {
	case err := <-pc.fatal:
		return err
	case <-ctx.Done():
		// The fronts stop, without starting, as soon as a mismatch is
		// found (stopping), and serve then ends ctx: the mismatch, sent
		// before stopping could say so, must still win.
		select {
		case err := <-pc.fatal:
			return err
		default:
			return nil
		}
	}
}

// stopping reports whether a first-list mismatch was found (serve is
// stopping: the fronts must not start).
func (pc *priceCheck) stopping() bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.failed
}

// ready is the /readyz check: not ready while a price names nothing.
func (pc *priceCheck) ready(context.Context) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if len(pc.stale) > 0 {
		return priceError(pc.stale)
	}
	return nil
}

// info is what /readyz shows of the prices: what unpriced items are.
func (pc *priceCheck) info() string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return unpricedSummary(pc.cfg)
}

// unpricedSummary says what items without a price are under cfg:
// "unpriced items free", or refused, naming the upstreams that differ
// from pricing.unpriced.
func unpricedSummary(cfg *Config) string {
	def := pricing.Unpriced(cfg.Pricing.Unpriced)
	var other []string
	for _, u := range cfg.Upstreams {
		if cfg.unpriced(u) != def {
			other = append(other, u.Name)
		}
	}
	s := "unpriced items " + describeUnpriced(def)
	if len(other) > 0 {
		s += fmt.Sprintf(" (pricing.unpriced: %s), but %s for upstream %s", def, describeUnpriced(otherThan(def)), strings.Join(other, ", "))
	} else {
		s += fmt.Sprintf(" (pricing.unpriced: %s)", def)
	}
	return s
}

func describeUnpriced(u pricing.Unpriced) string {
	if u == pricing.UnpricedRefuse {
		return "refused: neither listed nor sold"
	}
	return "free"
}

func otherThan(u pricing.Unpriced) pricing.Unpriced {
	if u == pricing.UnpricedRefuse {
		return pricing.UnpricedFree
	}
	return pricing.UnpricedRefuse
}

// checkedVendor is the Vendor as reloads see it: a reload's prices are
// checked against the upstreams' lists before they are set.
type checkedVendor struct {
	*vend.Vendor
	pc *priceCheck
}

func (c checkedVendor) checkPrices(next *Config, book *pricing.Book) error {
	return c.pc.checkPrices(next, book)
}

// SetPrices puts book in force, checked from now on.
func (c checkedVendor) SetPrices(book vend.PriceBook) {
	c.pc.inForce(book)
	c.Vendor.SetPrices(book)
}

var (
	_ priceChecker = checkedVendor{}
	_ grantEnder   = checkedVendor{}
)
