package redteam

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sync/errgroup"

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
	capvend   string // the capvend binary (runs the ledger commands): built with -race when the tests are
	serveBin  string // the capvend that serves: capvend unless CAPVEND_REDTEAM_SERVE names another
	tools     string // the example-tools binary
)

// parallel is how many tests (and subtests) run at once unless
// -test.parallel says: the tests mostly wait (for capvend to start and
// stop, for payments, session expiry, timeouts), so many more than the
// cores; each holds a capvend process or a few.
const parallel = 12

func TestMain(m *testing.M) {
	racesupp.Reexec() // go-nostr races inside itself: see package racesupp
	teststack.Parallel(parallel)
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
	teststack.Prepare() // the stack comes up while the binaries build
	setupOnce.Do(func() {
		if tmpDir, setupErr = os.MkdirTemp("", "capvend-redteam-"); setupErr != nil {
			return
		}
		// Both builds at once: linking is single-threaded.
		var g errgroup.Group
		tools = filepath.Join(tmpDir, "example-tools")
		g.Go(func() error {
			if out, err := exec.Command("go", "build", "-o", tools, "../cmd/example-tools").CombinedOutput(); err != nil {
				return fmt.Errorf("build example-tools: %v\n%s", err, out)
			}
			return nil
		})
		serve := os.Getenv("CAPVEND_REDTEAM_SERVE")
		if serve == "" && racesupp.Enabled {
			// The binary under attack runs with the race detector too
			// (finish fails the test on any report in its output); it
			// runs the ledger commands as well, one link fewer (a
			// report there fails them: exit code 66).
			capvend = filepath.Join(tmpDir, "capvend-race")
			g.Go(func() error {
				if out, err := exec.Command("go", "build", "-race", "-o", capvend, "../cmd/capvend").CombinedOutput(); err != nil {
					return fmt.Errorf("build capvend -race: %v\n%s", err, out)
				}
				return nil
			})
		} else {
			g.Go(func() (err error) {
				capvend, err = testnet.BuildCapvend(context.Background(), tmpDir)
				return err
			})
		}
		if setupErr = g.Wait(); setupErr != nil {
			return
		}
		serveBin = capvend
		if serve != "" {
			// Another build to attack (an older one, to see a test
			// fail where its hole is open); the suite's own capvend
			// still runs the ledger commands.
			serveBin = serve
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
