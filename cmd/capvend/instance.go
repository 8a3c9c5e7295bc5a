package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

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

// instanceClaims are the request claims of one instance (nil: none).
type instanceClaims struct {
	c        vend.RequestClaimer
	instance string
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
// instance serves and a claim would cost a write per request.
func (s *vendServer) claims() *instanceClaims {
	if s.cfg.Ledger.Driver != "postgres" {
		return nil
	}
	return &instanceClaims{c: s.l, instance: s.instance}
}

// shared is the Vendor's part in sharing the ledger: on PostgreSQL its
// leases (recovery and reconciliation on one instance, taken over within
// 30 s + 10 s of its death) and, with limits.requests_per_minute, the
// rate limit counted in the ledger; on SQLite none.
func (s *vendServer) shared() vend.SharedConfig {
	if s.cfg.Ledger.Driver != "postgres" {
		return vend.SharedConfig{}
	}
	sh := vend.SharedConfig{Leases: s.l, Instance: s.instance}
	if s.cfg.Limits.RequestsPerMinute > 0 {
		sh.Rates = s.l // one ledger write per call: see README, Several instances
	}
	return sh
}
