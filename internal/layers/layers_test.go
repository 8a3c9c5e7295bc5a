// Package layers holds one test: the module's packages import each other
// only inward (docs/ARCHITECTURE.md, "What may import what"): adapters,
// billing and ledger -> vend -> pricing.
package layers

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/capvend/capvend/internal/skip"
)

const module = "github.com/capvend/capvend/"

// forbidden lists, per package (a path relative to the module, covering
// the packages below it), the module packages it must not import.
var forbidden = map[string][]string{
	"pricing":          {"vend", "adapters", "billing", "ledger", "reconcile", "cmd", "internal/cli", "testnet"},
	"vend":             {"adapters", "billing", "ledger", "reconcile", "cmd", "internal/cli", "testnet", "migrations"},
	"billing/lnd":      {"adapters", "ledger", "cmd", "internal/cli", "testnet"},
	"billing/cashu":    {"adapters", "ledger", "cmd", "internal/cli", "testnet"},
	"billing/nwc":      {"adapters", "ledger", "cmd", "internal/cli", "testnet"},
	"adapters":         {"billing", "ledger", "reconcile", "cmd", "internal/cli", "testnet"},
	"ledger":           {"adapters", "billing", "cmd", "internal/cli", "testnet"},
	"internal/journal": {"adapters", "billing", "ledger", "reconcile", "cmd", "internal/cli", "testnet"},
}

// under reports whether pkg is path or below it.
func under(pkg, path string) bool { return pkg == path || strings.HasPrefix(pkg, path+"/") }

func TestImportsPointInward(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		if _, lookErr := exec.LookPath("go"); lookErr != nil {
			skip.Missing(t, "the go command", "install Go")
		}
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		for path, bad := range forbidden {
			if !under(pkg, path) {
				continue
			}
			checked++
			for _, imp := range fields[1:] {
				dep, ours := strings.CutPrefix(imp, module)
				if !ours {
					continue
				}
				for _, b := range bad {
					if under(dep, b) {
						t.Errorf("%s imports %s: dependencies point inward (adapters, billing, ledger -> vend -> pricing)", pkg, dep)
					}
				}
			}
		}
	}
	if checked < len(forbidden) {
		t.Fatalf("checked %d packages: go list found too few", checked)
	}
}

// TestRulesAreDocumented: the section this package's rules are written in
// exists, and shows each rule's package.
func TestRulesAreDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## What may import what\n")
	if !ok {
		t.Fatal(`docs/ARCHITECTURE.md has no section "What may import what"`)
	}
	for path := range forbidden {
		if !strings.Contains(section, "`"+path+"`") {
			t.Errorf(`docs/ARCHITECTURE.md's "What may import what" does not show the rule of %s`, path)
		}
	}
}
