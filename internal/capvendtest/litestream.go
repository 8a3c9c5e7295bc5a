package capvendtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/testnet"
)

var (
	litestreamOnce sync.Once
	litestreamBin  string
	litestreamErr  error
)

// Litestream returns the Litestream binary the backup tests run beside
// capvend, built once from the pinned module version (testnet).
func Litestream(t testing.TB) string {
	t.Helper()
	skip.Short(t, "builds Litestream "+testnet.LitestreamVersion)
	litestreamOnce.Do(func() {
		dir, err := testnet.DefaultBinDir()
		if err != nil {
			litestreamErr = err
			return
		}
		litestreamBin, litestreamErr = testnet.EnsureLitestream(context.Background(), dir, func(f string, a ...any) { fmt.Printf(f+"\n", a...) })
	})
	if litestreamErr != nil {
		t.Fatal(litestreamErr)
	}
	return litestreamBin
}

// Replicating runs `litestream replicate -config config` beside the test
// (as an operator runs it beside serve) until stop or the test's end.
func Replicating(t testing.TB, bin, config string) (stop func()) {
	t.Helper()
	cmd := exec.Command(bin, "replicate", "-config", config)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("litestream's log:\n%s", Tail(out.String(), 8000))
		}
	})
	return stop
}
