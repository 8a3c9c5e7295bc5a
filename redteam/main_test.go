package redteam

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/capvend/capvend/internal/racesupp"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/teststack"
)

// One build of each binary per package run, by the first test that needs
// them; the regtest stack is the one every test binary of the run shares
// (teststack).
var (
	setupOnce sync.Once
	setupErr  error
	tmpDir    string
	stack     *testnet.Stack
	capvend   string // the capvend binary (runs the ledger commands)
	serveBin  string // the capvend that serves: built with -race when the tests are
	tools     string // the example-tools binary
)

func TestMain(m *testing.M) {
	racesupp.Reexec() // go-nostr races inside itself: see package racesupp
	code := teststack.Run(m)
	if tmpDir != "" {
		os.RemoveAll(tmpDir)
	}
	os.Exit(code)
}

// binaries builds capvend and example-tools once, after checking that the
// regtest binaries (btcd, lnd) are built: starting the shared stack would
// otherwise build them, for many minutes, inside a test.
func binaries(t testing.TB) {
	t.Helper()
	skip.Short(t, "redteam drives the real binaries on the regtest stack")
	if dir, err := testnet.DefaultBinDir(); err != nil {
		skip.Missing(t, "no cache directory for the regtest binaries: "+err.Error(), "set HOME or XDG_CACHE_HOME")
	} else {
		for _, bin := range []string{
			filepath.Join(dir, "btcd-"+testnet.BtcdVersion, "btcd"),
			filepath.Join(dir, "lnd-"+testnet.LNDVersion, "lnd"),
		} {
			if _, err := os.Stat(bin); err != nil {
				skip.Missing(t, fmt.Sprintf("the regtest binaries are not built (%s)", bin), "go run ./cmd/capvend testnet build")
			}
		}
	}
	setupOnce.Do(func() {
		ctx := context.Background()
		if tmpDir, setupErr = os.MkdirTemp("", "capvend-redteam-"); setupErr != nil {
			return
		}
		if capvend, setupErr = testnet.BuildCapvend(ctx, tmpDir); setupErr != nil {
			return
		}
		tools = filepath.Join(tmpDir, "example-tools")
		if out, err := exec.Command("go", "build", "-o", tools, "../cmd/example-tools").CombinedOutput(); err != nil {
			setupErr = fmt.Errorf("build example-tools: %v\n%s", err, out)
			return
		}
		serveBin = capvend
		if bin := os.Getenv("CAPVEND_REDTEAM_SERVE"); bin != "" {
			// Another build to attack (an older one, to see a test
			// fail where its hole is open); the suite's own capvend
			// still runs the stack and the ledger commands.
			serveBin = bin
		} else if racesupp.Enabled {
			// The binary under attack runs with the race detector too;
			// finish fails the test on any report in its output.
			serveBin = filepath.Join(tmpDir, "capvend-race")
			if out, err := exec.Command("go", "build", "-race", "-o", serveBin, "../cmd/capvend").CombinedOutput(); err != nil {
				setupErr = fmt.Errorf("build capvend -race: %v\n%s", err, out)
			}
		}
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

var stackOnce sync.Once

// needStack returns the shared regtest stack, attaching on first use.
func needStack(t testing.TB) *testnet.Stack {
	t.Helper()
	binaries(t)
	s := teststack.Need(t)
	stackOnce.Do(func() { stack = s })
	return s
}
