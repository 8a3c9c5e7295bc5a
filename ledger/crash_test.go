package ledger_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// crashChildEnv makes the test binary run crashChild instead of the tests
// (see TestMain): the process TestKilledMidBatch kills.
const crashChildEnv = "CAPVEND_LEDGER_CRASH_CHILD"

// lifecycle is the paid call's steps in order, as reported by crashChild.
var lifecycle = []vend.CallState{vend.CallQuoted, vend.CallAwaitingPayment, vend.CallPaid, vend.CallExecuting, vend.CallDelivered}

// crashChild runs paid calls on the ledger at path with 16 callers at once
// and prints "<call> <state>" as soon as each step's write returned nil:
// what a caller was told is on disk. It runs until it is killed.
func crashChild(path string) {
	ctx := context.Background()
	l, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var out sync.Mutex
	told := func(i int, s vend.CallState) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, "%d %s\n", i, s) // unbuffered: in the pipe before the next write
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)); i < 1_000_000; i = int(next.Add(1)) {
				c, _, err := l.RecordCall(ctx, newCall(i))
				if err != nil {
					fail(err)
				}
				told(i, vend.CallQuoted)
				p, err := l.RecordPayment(ctx, c.ID, newPayment(i))
				if err != nil {
					fail(err)
				}
				told(i, vend.CallAwaitingPayment)
				if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
					fail(err)
				}
				told(i, vend.CallPaid)
				if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
					fail(err)
				}
				told(i, vend.CallExecuting)
				if err := l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{"content":[]}`)}); err != nil {
					fail(err)
				}
				told(i, vend.CallDelivered)
			}
		}()
	}
	wg.Wait()
	os.Exit(0)
}

// A process killed (SIGKILL) while its writers' batches are in flight
// loses nothing it told a caller was written: after reopening, every
// call is at least at the last step its caller was told succeeded, and
// the books verify.
func TestKilledMidBatch(t *testing.T) {
	ledger.SkipOnPostgres(t, "SQLite's durability across a killed process (PostgreSQL's is the server's)")
	path := filepath.Join(t.TempDir(), "capvend.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	told := map[int]int{} // call -> index in lifecycle of the last step told
	lines := 0
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		i, err := strconv.Atoi(f[0])
		if len(f) != 2 || err != nil {
			t.Fatalf("child printed %q", sc.Text())
		}
		for k, s := range lifecycle {
			if string(s) == f[1] && k >= told[i] {
				told[i] = k
			}
		}
		if lines++; lines == 2000 {
			cmd.Process.Kill() // the lines already in the pipe are still read
		}
	}
	cmd.Wait()
	if lines < 2000 {
		t.Fatalf("the child stopped after %d steps: %s", lines, stderr.String())
	}

	ctx := context.Background()
	l := openLedger(t, path)
	for i, k := range told {
		c, err := l.CallByRequest(ctx, "mcp-http", "client-1", fmt.Sprint("req-", i))
		if err != nil {
			t.Fatalf("call %d, told %s: %v", i, lifecycle[k], err)
		}
		got := -1
		for j, s := range lifecycle {
			if c.State == s {
				got = j
			}
		}
		if got < k {
			t.Fatalf("call %d is %s after the crash; its caller was told %s", i, c.State, lifecycle[k])
		}
	}
	mustVerify(t, l)
	t.Logf("killed after %d steps told; %d calls checked", lines, len(told))
}
