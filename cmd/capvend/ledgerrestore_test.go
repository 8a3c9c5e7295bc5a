package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

var (
	litestreamOnce sync.Once
	litestreamBin  string
	litestreamErr  error
)

// litestream returns the Litestream binary the backup tests run beside
// capvend, built once from the pinned module version (testnet).
func litestream(t testing.TB) string {
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

// replicating runs `litestream replicate -config config` beside the test
// (as an operator runs it beside serve) until stop or the test's end.
func replicating(t testing.TB, bin, config string) (stop func()) {
	t.Helper()
	cmd := exec.Command(bin, "replicate", "-config", config)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	var out lockedWriter
	out.w = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = &out, &out
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
			t.Logf("litestream's log:\n%s", tail(&out, 8000))
		}
	})
	return stop
}

// caughtUp waits until doctor's replica check finds no lag.
func caughtUp(t testing.TB, cfg *Config) outcome {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		o := checkReplica(context.Background(), cfg, time.Now())
		if o.status == "ok" && strings.HasPrefix(o.detail, "lag 0s") {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not catch up: %+v", o)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// deliveredCalls books n paid, delivered calls of 21 sat, request ids
// from r<from>.
func deliveredCalls(t *testing.T, l *ledger.Ledger, from, n int) {
	t.Helper()
	ctx := context.Background()
	for i := from; i < from+n; i++ {
		c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "c", RequestID: fmt.Sprint("r", i),
			Server: "demo", Tool: "echo", ArgsHash: fmt.Sprintf("%064x", i), Price: 21_000, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		p, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
			Ref: fmt.Sprintf("%064x", 1000+i), Bolt11: "lnbcrt210n1test", Amount: 21_000, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			t.Fatal(err)
		}
		if err := l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{"content":[{"type":"text","text":"ok"}]}`)}); err != nil {
			t.Fatal(err)
		}
	}
}

// countCalls is how many calls the ledger file at path holds.
func countCalls(t *testing.T, path string) int {
	t.Helper()
	l, err := ledger.Open(context.Background(), path, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	calls, err := l.CallsIn(context.Background(), vend.CallStates()...)
	if err != nil {
		t.Fatal(err)
	}
	return len(calls)
}

// TestLedgerRestoreFromFileReplica runs Litestream beside a ledger in use
// with the configuration `capvend ledger litestream-config` writes, to a
// file:// replica: doctor sees the replica catch up and then lag when
// replication stops; `capvend ledger restore` brings back the newest state
// and a point in time, verified, settles the unfinished call, refuses to
// overwrite a file or to restore beside an old ledger's -wal; and after a
// restore into ledger.path, Litestream replicates the restored ledger on.
func TestLedgerRestoreFromFileReplica(t *testing.T) {
	bin := litestream(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "capvend.db")
	yaml := fmt.Sprintf("ledger:\n  path: capvend.db\n  replica: file://%s\n  litestream: %s\nserver:\n  name: t\n",
		filepath.Join(dir, "replica"), bin)
	if err := os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(filepath.Join(dir, "capvend.yaml"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := ledger.Open(ctx, db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	paidCalls(t, l, 6) // 4 delivered, 1 refunded, 1 awaiting payment

	capvendIn(t, dir, nil, "ledger", "litestream-config", "--out", "litestream.yml")
	ly, _ := os.ReadFile(filepath.Join(dir, "litestream.yml"))
	if !strings.Contains(string(ly), db) || !strings.Contains(string(ly), "file://"+filepath.Join(dir, "replica")) {
		t.Fatalf("litestream.yml:\n%s", ly)
	}
	stop := replicating(t, bin, filepath.Join(dir, "litestream.yml"))
	o := caughtUp(t, cfg)
	t.Logf("doctor: %s: %s", o.name, o.detail)

	// A point in time between two batches (LTX files are listed to the
	// second; Litestream restores the last change at or before it).
	time.Sleep(1100 * time.Millisecond)
	point := time.Now()
	time.Sleep(1100 * time.Millisecond)
	deliveredCalls(t, l, 100, 3)
	caughtUp(t, cfg)

	out := capvendIn(t, dir, nil, "ledger", "restore", "--to", "restored/latest.db")
	if !strings.Contains(out, "1 canceled, 0 refunded, 0 failed") || !strings.Contains(out, "checks passed") {
		t.Fatalf("restore:\n%s", out)
	}
	latest := filepath.Join(dir, "restored", "latest.db")
	if st, err := os.Stat(latest); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("restored file: %v %v", st, err)
	}
	if n := countCalls(t, latest); n != 9 {
		t.Fatalf("the newest state holds %d calls, want 9", n)
	}
	capvendIn(t, dir, nil, "ledger", "restore", "--to", "restored/then.db", "--at", point.UTC().Format(time.RFC3339Nano))
	if n := countCalls(t, filepath.Join(dir, "restored", "then.db")); n != 6 {
		t.Fatalf("the state as of %s holds %d calls, want 6", point, n)
	}
	before, _ := os.ReadFile(latest)
	if out := capvendFails(t, dir, "ledger", "restore", "--to", "restored/latest.db"); !strings.Contains(out, "refusing to overwrite") {
		t.Fatalf("restore over a file:\n%s", out)
	}
	if after, _ := os.ReadFile(latest); !bytes.Equal(before, after) {
		t.Fatal("the refused restore changed the file")
	}
	if err := os.WriteFile(filepath.Join(dir, "restored", "x.db-wal"), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := capvendFails(t, dir, "ledger", "restore", "--to", "restored/x.db"); !strings.Contains(out, "x.db-wal exists") {
		t.Fatalf("restore beside a stale -wal:\n%s", out)
	}

	// Replication stops; the books change: doctor reports the lag.
	stop()
	time.Sleep(replicaLagWarn + 1100*time.Millisecond)
	deliveredCalls(t, l, 200, 1)
	if o := checkReplica(ctx, cfg, time.Now()); o.status != "WARN" || !strings.Contains(o.detail, "lag ") {
		t.Fatalf("doctor after replication stopped: %+v", o)
	}

	// Disaster: the ledger is lost with its -wal, -shm and Litestream's
	// folder; restore it into ledger.path, and replication goes on.
	l.Close()
	for _, p := range []string{db, db + "-wal", db + "-shm", filepath.Join(dir, ".capvend.db-litestream")} {
		os.RemoveAll(p)
	}
	capvendIn(t, dir, nil, "ledger", "restore", "--to", "capvend.db")
	if n := countCalls(t, db); n != 9 {
		t.Fatalf("the restored ledger holds %d calls, want 9 (the last one was never replicated)", n)
	}
	if l, err = ledger.Open(ctx, db, ledger.Options{MustExist: true}); err != nil {
		t.Fatal(err)
	}
	deliveredCalls(t, l, 300, 2)
	replicating(t, bin, filepath.Join(dir, "litestream.yml"))
	caughtUp(t, cfg)
	capvendIn(t, dir, nil, "ledger", "restore", "--to", "restored/after.db")
	if n := countCalls(t, filepath.Join(dir, "restored", "after.db")); n != 11 {
		t.Fatalf("after the restore, the replica holds %d calls, want 11", n)
	}
	if out := capvendIn(t, dir, nil, "ledger", "verify", "--db", "restored/after.db"); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify:\n%s", out)
	}
}

// TestReplicaSettings: ledger.replica is checked when the configuration
// loads, and its credentials file is a secret like the others: serve
// refuses to start while others may read it, naming it, never its text.
func TestReplicaSettings(t *testing.T) {
	for _, tc := range []struct {
		name, ledger, err string
	}{
		{"file", "  replica: file:///var/backups/capvend\n", ""},
		{"s3 with credentials", "  replica: s3://bucket/capvend?endpoint=http://127.0.0.1:9000\n  replica_credentials_file: replica.env\n", ""},
		{"relative file", "  replica: file://backups\n", "ledger.replica: "},
		{"another scheme", "  replica: gs://bucket/capvend\n", "ledger.replica: "},
		{"credentials without a replica", "  replica_credentials_file: replica.env\n", "ledger.replica_credentials_file: set without ledger.replica"},
		{"credentials for a file replica", "  replica: file:///var/backups/capvend\n  replica_credentials_file: replica.env\n", "takes no credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "capvend.yaml")
			if err := os.WriteFile(path, []byte("ledger:\n  path: capvend.db\n"+tc.ledger+"server:\n  name: t\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := loadConfig(path, func(string) string { return "" })
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("loadConfig: %v, want %q", err, tc.err)
			}
		})
	}
	t.Run("credentials others can read", func(t *testing.T) {
		dir := t.TempDir()
		env := filepath.Join(dir, "replica.env")
		if err := os.WriteFile(env, []byte("AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY=s3cr3t\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(dir, "capvend.yaml")
		body := "ledger:\n  path: capvend.db\n  replica: s3://bucket/capvend\n  replica_credentials_file: replica.env\nserver:\n  name: t\nhttp:\n  listen: 127.0.0.1:0\n"
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, errOut, code := run(t, nil, "serve", "--config", cfg)
		if code != 1 || !strings.Contains(errOut, "ledger.replica_credentials_file:") || !strings.Contains(errOut, "chmod 600 "+env) ||
			strings.Contains(errOut, "s3cr3t") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
		_, errOut, code = run(t, nil, "ledger", "restore", "--config", cfg, "--to", filepath.Join(dir, "r.db"))
		if code == 0 || !strings.Contains(errOut, "chmod 600 "+env) {
			t.Fatalf("restore: exit %d, stderr:\n%s", code, errOut)
		}
	})
}
