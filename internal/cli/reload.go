package cli

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"sync"
	"syscall"
	"time"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// priceSetter takes a new price book (vend.Vendor).
type priceSetter interface{ SetPrices(vend.PriceBook) }

// priceChecker is the optional ability of a priceSetter to refuse a
// price book before it is set (see priceCheck).
type priceChecker interface {
	checkPrices(next *Config, book *pricing.Book) error
}

// reloadPrices re-reads the configuration file cur was read from and, if
// it is valid (and v, a priceChecker, accepts its prices), gives v its
// prices and calls refresh (tool lists and announcements change). It
// returns the configuration now in force: cur when the new one is
// refused. Only prices (and pricing.unpriced) change without a restart;
// other changed sections are logged.
func reloadPrices(cur *Config, getenv func(string) string, v priceSetter, refresh func(), log *slog.Logger) (*Config, error) {
	next, err := loadConfig(cur.path, getenv)
	if err != nil {
		return cur, err
	}
	book, err := next.PriceBook()
	if err != nil {
		return cur, err
	}
	if pc, ok := v.(priceChecker); ok {
		if err := pc.checkPrices(next, book); err != nil {
			return cur, err
		}
	}
	if changed := restartSections(cur, next); len(changed) > 0 {
		log.Warn("config reload: these settings changed but only take effect after a restart", "sections", changed)
	}
	v.SetPrices(book)
	endFreedGrants(v, log)
	refresh()
	return next, nil
}

// grantEnder is the optional ability of a priceSetter (vend.Vendor) to end
// the explicit-gating grants its new prices made free.
type grantEnder interface {
	RefundFreedGrants(ctx context.Context) (int, error)
}

// endFreedGrants refunds the paid grants of items v's prices made free
// (see vend.Vendor.RefundFreedGrants), so their money is owed back rather
// than kept for calls that now run free.
func endFreedGrants(v any, log *slog.Logger) {
	ge, ok := v.(grantEnder)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := ge.RefundFreedGrants(ctx)
	if err != nil {
		log.Error("grants of items that became free: some were not ended; they are retried at the next reload or start", "err", err)
	}
	if n > 0 {
		log.Info("grants of items that became free were ended (paid ones are owed back)", "grants", n)
	}
}

// restartSections names the sections of next that differ from cur other
// than the prices of tools, prompts and resources and what unpriced ones
// are.
func restartSections(cur, next *Config) []string {
	var out []string
	a, b := *cur, *next
	if !reflect.DeepEqual(withoutPrices(a.Upstreams), withoutPrices(b.Upstreams)) {
		out = append(out, "upstreams")
	}
	a.Upstreams, b.Upstreams = nil, nil
	a.Pricing, b.Pricing = PricingConfig{}, PricingConfig{}
	ta, tb := reflect.TypeOf(a), reflect.ValueOf(b)
	va := reflect.ValueOf(a)
	for i := range ta.NumField() {
		f := ta.Field(i)
		if !f.IsExported() {
			continue
		}
		if !reflect.DeepEqual(va.Field(i).Interface(), tb.Field(i).Interface()) {
			out = append(out, f.Tag.Get("yaml"))
		}
	}
	return out
}

// withoutPrices returns ups without their price sections (tools, prompts,
// resources and unpriced: all of them reload).
func withoutPrices(ups []UpstreamConfig) []UpstreamConfig {
	out := make([]UpstreamConfig, len(ups))
	for i, u := range ups {
		u.Tools, u.Prompts, u.Resources, u.Unpriced = nil, nil, nil, ""
		out[i] = u
	}
	return out
}

// reloadOnHUP starts reloading the prices on every SIGHUP, until ctx ends
// (the goroutine is tracked by wg). The signal is caught from the moment it
// returns, so a SIGHUP never kills a running server.
// reloaded, if not nil, is told each configuration put in force.
func reloadOnHUP(ctx context.Context, wg *sync.WaitGroup, cfg *Config, getenv func(string) string, v priceSetter, refresh func(), reloaded func(*Config), log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				next, err := reloadPrices(cfg, getenv, v, refresh, log)
				if err != nil {
					log.Error("config reload refused; the old prices stay", "config", cfg.path, "err", err)
					continue
				}
				cfg = next
				log.Info("config reloaded: new prices in force", "config", cfg.path)
				if reloaded != nil {
					reloaded(next)
				}
			}
		}
	}()
}
