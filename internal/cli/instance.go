package cli

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// newInstanceID names this process among the capvend instances sharing a
// ledger: host, process id and a random part (a restarted process is a
// new instance).
func newInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "capvend"
	}
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// instanceClaims are the request claims of one instance (nil: none),
// and the member set its Nostr front shards the requests by.
type instanceClaims struct {
	c        vend.RequestClaimer
	members  ctxvm.Members
	instance string
}

var _ ctxvm.Members = (*ledger.Ledger)(nil)

func (c *instanceClaims) memberSet() ctxvm.Members {
	if c == nil {
		return nil
	}
	return c.members
}

func (c *instanceClaims) claimer() vend.RequestClaimer {
	if c == nil {
		return nil
	}
	return c.c
}

func (c *instanceClaims) id() string {
	if c == nil {
		return ""
	}
	return c.instance
}

// claims returns the Nostr request claims of this instance: only on a
// PostgreSQL ledger, which several instances share. On SQLite one
// instance serves and a claim would cost a write per request. With
// nostr.shard the requests are sharded across the live instances (see
// docs/CONTEXTVM.md): in steady state an instance writes no claim.
func (s *vendServer) claims() *instanceClaims {
	if s.cfg.Ledger.Driver != "postgres" {
		return nil
	}
	c := &instanceClaims{c: s.l, instance: s.instance}
	if s.cfg.Nostr.Shard {
		c.members = s.l
	}
	return c
}

var _ mcpfront.SessionStore = (*ledger.Ledger)(nil)

// shared is the Vendor's part in sharing the ledger: on PostgreSQL its
// leases (recovery and reconciliation on one instance, taken over within
// ledger.lease_ttl and a third of it after its death) and, with
// limits.requests_per_minute, the rate limit counted in the ledger, and
// the unpaid limits counted there too; on SQLite none.
func (s *vendServer) shared() vend.SharedConfig {
	if s.cfg.Ledger.Driver != "postgres" {
		return vend.SharedConfig{}
	}
	sh := vend.SharedConfig{Leases: s.l, Instance: s.instance, LeaseTTL: s.cfg.Ledger.LeaseTTL}
	if s.cfg.Limits.RequestsPerMinute > 0 {
		sh.Rates = s.l // one ledger write per call: see docs/OPERATING.md, Several instances
	}
	sh.Unpaid = s.l // one ledger read per new quote: see docs/OPERATING.md, Several instances
	return sh
}

// priceHash is the hash of cfg's price book: SHA-256 of its rules as JSON
// (encoding/json writes map keys sorted, so equal books hash equal), with
// the upstreams whose unpriced items are refused, if any.
func priceHash(cfg *Config) (string, error) {
	rules, err := cfg.priceRules()
	if err != nil {
		return "", err
	}
	var v any = rules
	// What unpriced items are is part of the prices; free, the default,
	// keeps the hash of the rules alone (as before it was a setting).
	refused := map[string]pricing.Unpriced{}
	for server, u := range cfg.unpricedBy() {
		if u == pricing.UnpricedRefuse {
			refused[server] = u
		}
	}
	if len(refused) > 0 {
		v = map[string]any{"rules": rules, "unpriced": refused}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// registerPrices records this instance's price book hash in a PostgreSQL
// ledger, refusing to start when a live instance sharing it has other
// prices (see ledger.RegisterPrices). Nothing on SQLite.
func (s *vendServer) registerPrices(ctx context.Context) error {
	if s.cfg.Ledger.Driver != "postgres" {
		return nil
	}
	h, err := priceHash(s.cfg)
	if err != nil {
		return err
	}
	err = s.l.RegisterPrices(ctx, s.instance, h, s.cfg.Ledger.LeaseTTL, false)
	if errors.Is(err, ledger.ErrPricesDiffer) {
		return fmt.Errorf("%w: every capvend instance sharing this ledger must sell at the same prices, and this one's configuration prices differ; "+
			"give it the same prices, or change the prices of the running instances first (SIGHUP each)", err)
	}
	return err
}

// pricesReloaded records the hash of a reloaded price book (SIGHUP) in a
// PostgreSQL ledger; the new prices are in force whatever the others
// have, and an error is logged while they differ from another live
// instance's (change every instance's prices, SIGHUP each).
func pricesReloaded(ctx context.Context, l *ledger.Ledger, instance string, next *Config, log *slog.Logger) {
	if next.Ledger.Driver != "postgres" {
		return
	}
	h, err := priceHash(next)
	if err == nil {
		err = l.RegisterPrices(ctx, instance, h, next.Ledger.LeaseTTL, true)
	}
	switch {
	case errors.Is(err, ledger.ErrPricesDiffer):
		log.Error("the reloaded prices differ from another running instance's: each sells at its own prices until all have the same (reload every instance)", "err", err)
	case err != nil:
		log.Error("the reloaded price book was not recorded in the ledger", "err", err)
	}
}
