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
	"github.com/capvend/capvend/testnet"
)

// One regtest stack and one build of each binary per package run: started
// by the first test that needs them, stopped by TestMain.
var (
	setupOnce sync.Once
	setupErr  error
	tmpDir    string
	stack     *testnet.Stack
	capvend   string // the capvend binary (runs the stack's mint and relay, and the ledger commands)
	serveBin  string // the capvend that serves: built with -race when the tests are
	tools     string // the example-tools binary
)

func TestMain(m *testing.M) {
	racesupp.Reexec() // go-nostr races inside itself: see package racesupp
	code := m.Run()
	if stack != nil {
		if err := stack.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "redteam: stopping the stack:", err)
		}
	}
	if tmpDir != "" {
		os.RemoveAll(tmpDir)
	}
	os.Exit(code)
}

// missingPart skips t because a real part it needs is not on this
// machine (why says which, and how to get it); under CI=true, where
// .ci/run installs every part, that fails t instead: a test never passes
// without having run.
func missingPart(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: .ci/run should have provided it)", why)
	}
	t.Skip(why)
}

// binaries builds capvend and example-tools once, after checking that the
// regtest binaries (btcd, lnd) are built: testnet.Start would otherwise
// build them itself, for many minutes, inside a test.
func binaries(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("redteam drives the real binaries on the regtest stack (not in -short mode)")
	}
	if dir, err := testnet.DefaultBinDir(); err != nil {
		missingPart(t, "no cache directory for the regtest binaries: "+err.Error())
	} else {
		for _, bin := range []string{
			filepath.Join(dir, "btcd-"+testnet.BtcdVersion, "btcd"),
			filepath.Join(dir, "lnd-"+testnet.LNDVersion, "lnd"),
		} {
			if _, err := os.Stat(bin); err != nil {
				missingPart(t, fmt.Sprintf("the regtest binaries are not built (%s): run `go run ./cmd/capvend testnet build`", bin))
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

var (
	stackOnce sync.Once
	stackErr  error
)

// needStack returns the regtest stack, starting it on first use.
func needStack(t testing.TB) *testnet.Stack {
	t.Helper()
	binaries(t)
	stackOnce.Do(func() {
		stack, stackErr = testnet.Start(context.Background(), testnet.Options{
			Dir: filepath.Join(tmpDir, "stack"), Executable: capvend, Progress: os.Stderr})
	})
	if stackErr != nil {
		t.Fatal(stackErr)
	}
	return stack
}
