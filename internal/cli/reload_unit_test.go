package cli

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capvend/capvend/vend"
)

// recordingSetter records the books it is given.
type recordingSetter struct{ books []vend.PriceBook }

func (r *recordingSetter) SetPrices(b vend.PriceBook) { r.books = append(r.books, b) }

func TestReloadPrices(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "capvend.yaml")
	base := "ledger:\n  path: capvend.db\nhttp:\n  listen: 127.0.0.1:8402\nlnd:\n  host: 127.0.0.1:10009\n  tls_cert_file: tls.cert\n  macaroon_file: invoice.macaroon\nupstreams:\n  - name: tools\n    command: ./tools\n    tools:\n      sha256: {price_sats: PRICE}\n"
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(strings.Replace(base, "PRICE", "21", 1))
	getenv := func(string) string { return "" }
	cur, err := loadConfig(path, getenv)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var rs recordingSetter
	refreshed := 0
	refresh := func() { refreshed++ }

	write(strings.Replace(base, "PRICE", "34", 1))
	next, err := reloadPrices(cur, getenv, &rs, refresh, log)
	if err != nil || len(rs.books) != 1 || refreshed != 1 {
		t.Fatalf("valid reload: err %v, books %d, refreshes %d", err, len(rs.books), refreshed)
	}
	q, err := rs.books[0].Quote("tools", "sha256", []byte(`{}`))
	if err != nil || q.Price != 34_000 {
		t.Fatalf("new book quotes %v, %v; want 34 sat", q.Price, err)
	}

	for name, bad := range map[string]string{
		"negative price": strings.Replace(base, "PRICE", "-1", 1),
		"not YAML":       "upstreams: [",
		"unknown key":    strings.Replace(base, "PRICE", "21, colour: red", 1),
	} {
		write(bad)
		got, err := reloadPrices(next, getenv, &rs, refresh, log)
		if err == nil || got != next || len(rs.books) != 1 || refreshed != 1 {
			t.Errorf("%s: err %v, config kept %v, books %d, refreshes %d", name, err, got == next, len(rs.books), refreshed)
		}
	}

	// Sections other than prices are reported as needing a restart.
	changed := strings.Replace(strings.Replace(base, "PRICE", "34", 1), "127.0.0.1:8402", "127.0.0.1:9999", 1)
	changed = strings.Replace(changed, "command: ./tools", "command: ./tools2", 1)
	write(changed)
	after, err := loadConfig(path, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if got := restartSections(next, after); !slices.Equal(got, []string{"upstreams", "http"}) {
		t.Fatalf("restart sections %v, want [upstreams http]", got)
	}
	if got := restartSections(next, next); len(got) != 0 {
		t.Fatalf("unchanged config: %v", got)
	}
}

// Prices of prompts and resources reload like tools' prices: changing
// them is not reported as needing a restart.
func TestReloadItemPricesNeedNoRestart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "capvend.yaml")
	base := "ledger:\n  path: capvend.db\nlnd:\n  host: 127.0.0.1:10009\n  tls_cert_file: tls.cert\n  macaroon_file: invoice.macaroon\n" +
		"upstreams:\n  - name: tools\n    command: ./tools\n    prompts:\n      brief: {price_sats: PROMPT}\n    resources:\n      \"ex://r/{id}\": {price_sats: RES}\n"
	load := func(prompt, res string) *Config {
		t.Helper()
		body := strings.NewReplacer("PROMPT", prompt, "RES", res).Replace(base)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := loadConfig(path, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cur := load("3", "2")
	if got := restartSections(cur, load("5", "2")); len(got) != 0 {
		t.Fatalf("a prompt price change is reported as needing a restart: %v", got)
	}
	if got := restartSections(cur, load("3", "7")); len(got) != 0 {
		t.Fatalf("a resource price change is reported as needing a restart: %v", got)
	}
}
