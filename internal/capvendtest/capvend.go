package capvendtest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/syncbuf"
)

// Options says how Start runs capvend. With Main, Binary and Config set
// (package cli's tests set them once, in their startCapvend) and nothing
// else, it runs `capvend serve --config <config>` in this test binary and
// returns once it serves every front its configuration turns on.
type Options struct {
	// Main runs capvend's command line in this process (cli.Main, which
	// this package cannot import: package cli's tests import it), with p
	// as its standard streams, environment and log. Needed unless
	// Process.
	Main func(ctx context.Context, args []string, p Proc) int
	// Binary returns the built capvend binary (built once for the test
	// binary). Needed with Process.
	Binary func(testing.TB) string
	// Config reads what Start needs of a configuration file (see
	// Fronts). Needed to wait for a serve, and by Capvend.Ledger.
	Config func(path string, getenv func(string) string) (Fronts, error)
	// Args is the command line; nil means serve --config <config>.
	Args []string
	// Process runs the built binary (Binary) as a child process, as
	// a user does: for signals (SIGHUP, SIGKILL), failpoints, its pid,
	// and commands that must not share this process.
	Process bool
	// Failpoint, with Process, is CAPVEND_FAILPOINT: the step at which
	// the binary kills itself (the crash tests).
	Failpoint string
	// Env is the environment capvend sees ("KEY=value"): in this
	// process all of it; for a Process it is added to this process's
	// environment (to PATH and HOME only with UserShell).
	Env []string
	// UserShell, with Process, runs it as a user at a shell would: with
	// only PATH and HOME of this process's environment, plus Env.
	UserShell bool
	// Dir, with Process, is the folder it runs in.
	Dir string
	// LockWait, in this process, replaces how long serve waits for the
	// serve holding its SQLite ledger (cli.Env.LockWait).
	LockWait time.Duration
	// Stdin and Stdout are capvend's (default: empty, and kept for
	// Stdout()).
	Stdin  io.Reader
	Stdout io.Writer
	// NoWait returns at once, without waiting for serve to serve: for a
	// serve expected to fail, to wait, or to be waited for by the test.
	NoWait bool
}

// Proc is what capvend run in this process sees of the outside world
// (Options.Main passes it on as cli.Env).
type Proc struct {
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer
	Getenv   func(string) string
	Log      *slog.Logger
	LockWait time.Duration
}

// Fronts is what Start needs of a capvend configuration.
type Fronts struct {
	HTTP   bool   // it serves MCP over HTTP (http.listen)
	Nostr  bool   // it serves ContextVM (nostr.relays)
	Ledger string // the path of its SQLite ledger
}

// Capvend is a capvend a test started (Start).
type Capvend struct {
	t      testing.TB
	config string
	o      Options
	cmd    *exec.Cmd          // with Process
	cancel context.CancelFunc // in this process
	stdout *syncbuf.Buffer
	stderr *syncbuf.Buffer
	logs   io.Writer // its slog log in this process (a *syncbuf.Buffer, or io.Discard)
	done   chan struct{}
	code   int  // once done is closed
	serves bool // a serve Start waited for: it must exit 0 when stopped
	once   sync.Once
}

// ExitKilled is Wait's code for a process killed by SIGKILL (as a shell
// reports it).
const ExitKilled = 128 + int(syscall.SIGKILL)

// Start is the one way the tests start capvend: `capvend serve
// --config config` (or o.Args) in this process or, with o.Process, as the
// built binary. Unless o.NoWait or o.Args is set, it returns once serve
// says it serves each front its configuration turns on (HTTP, Nostr),
// failing the test if it exits first. At the test's end a capvend still
// running in this process is stopped and must exit 0; a process is
// killed. Its log (this process) or standard error (a process) is shown
// when the test fails.
func Start(t testing.TB, config string, o Options) *Capvend {
	t.Helper()
	args := o.Args
	if args == nil {
		args = []string{"serve", "--config", config}
	}
	c := &Capvend{t: t, config: config, o: o, stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{},
		logs: &syncbuf.Buffer{}, done: make(chan struct{}), serves: o.Args == nil && !o.NoWait}
	level := slog.LevelDebug // why an event was dropped, a payment misbehaved...
	if _, bench := t.(*testing.B); bench {
		c.logs, level = io.Discard, slog.LevelInfo // a benchmark's calls would fill it
	}
	var stdout io.Writer = c.stdout
	if o.Stdout != nil {
		stdout = o.Stdout
	}
	stdin := o.Stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	if o.Process {
		c.cmd = exec.Command(o.Binary(t), args...)
		c.cmd.Dir, c.cmd.Stdin, c.cmd.Stdout, c.cmd.Stderr = o.Dir, stdin, stdout, c.stderr
		c.cmd.Env = append(os.Environ(), o.Env...)
		if o.UserShell {
			c.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, o.Env...)
		}
		if o.Failpoint != "" {
			c.cmd.Env = append(c.cmd.Env, "CAPVEND_FAILPOINT="+o.Failpoint)
		}
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			err := c.cmd.Wait()
			c.code = c.cmd.ProcessState.ExitCode()
			if st, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				c.code = 128 + int(st.Signal())
			} else if err != nil && c.code == 0 {
				c.code = -1
			}
			close(c.done)
		}()
	} else {
		ctx, cancel := context.WithCancel(context.Background())
		c.cancel = cancel
		p := Proc{Stdin: stdin, Stdout: stdout, Stderr: c.stderr, Getenv: o.getenv,
			Log: slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: level})), LockWait: o.LockWait}
		go func() {
			// Its goroutines carry the label capvend=<its config's dir> in
			// CPU profiles (go tool pprof -tagfocus; see
			// BenchmarkNostrFreeCallInstances).
			pprof.Do(ctx, pprof.Labels("capvend", filepath.Base(filepath.Dir(config))), func(ctx context.Context) {
				c.code = o.Main(ctx, args, p)
			})
			close(c.done)
		}()
	}
	t.Cleanup(func() {
		if c.cmd != nil {
			c.cmd.Process.Kill()
			<-c.done
		} else if code, stopped := c.stop(); stopped && c.serves && code != 0 {
			t.Errorf("capvend exited %d: %s", code, Tail(c.Stderr(), 8000))
		}
		if t.Failed() {
			t.Logf("capvend %s: log:\n%s", strings.Join(args, " "), Tail(c.Logs(), 20_000))
		}
	})
	if o.Args == nil && !o.NoWait {
		var want []string
		if cfg, err := o.Config(config, o.getenv); err == nil {
			if cfg.HTTP {
				want = append(want, "capvend: serving MCP at ")
			}
			if cfg.Nostr {
				want = append(want, "capvend: serving ContextVM ")
			}
		}
		c.Await("serving", func() bool {
			out := c.Stderr()
			for _, w := range want {
				if !strings.Contains(out, w) {
					return false
				}
			}
			return true
		})
	}
	return c
}

// Await waits until ready says so, failing the test if capvend exits
// first or 60 s pass (a deadlock guard, not a speed check).
func (c *Capvend) Await(what string, ready func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		select {
		case <-c.done:
			c.t.Fatalf("%s: capvend exited %d first; its standard error:\n%s", what, c.code, c.Stderr())
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within 60 s; capvend's standard error:\n%s", what, c.Stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops capvend as SIGTERM does (the context of one in this
// process ends) and waits for it: it must exit 0. Stopping a stopped
// capvend does nothing.
func (c *Capvend) Stop() {
	c.t.Helper()
	if code, stopped := c.stop(); stopped && code != 0 {
		c.t.Fatalf("capvend exited %d when stopped: %s", code, Tail(c.Stderr(), 8000))
	}
}

// stop stops capvend and returns its exit code; stopped is false if an
// earlier stop did.
func (c *Capvend) stop() (code int, stopped bool) {
	c.t.Helper()
	c.once.Do(func() {
		if c.cmd != nil {
			c.cmd.Process.Signal(syscall.SIGTERM)
		} else {
			c.cancel()
		}
		code, stopped = c.Wait(), true
	})
	return code, stopped
}

// Signal sends sig to the process (Process only).
func (c *Capvend) Signal(sig os.Signal) {
	c.t.Helper()
	if c.cmd == nil {
		c.t.Fatal("Signal: capvend runs in this process")
	}
	c.cmd.Process.Signal(sig)
}

// Wait waits for capvend to exit, 15 minutes at most (a hang guard: the
// demo takes minutes), and
// returns its exit code: 128+n for a process killed by signal n
// (ExitKilled for SIGKILL).
func (c *Capvend) Wait() int {
	c.t.Helper()
	select {
	case <-c.done:
		return c.code
	case <-time.After(15 * time.Minute):
		c.t.Fatalf("capvend did not exit within 15 minutes: %s", c.Stderr())
		return -1
	}
}

// Exited reports whether capvend has exited, and its code if so.
func (c *Capvend) Exited() (code int, exited bool) {
	select {
	case <-c.done:
		return c.code, true
	default:
		return 0, false
	}
}

// Pid is the process's pid (this process's for one in it).
func (c *Capvend) Pid() int {
	if c.cmd != nil {
		return c.cmd.Process.Pid
	}
	return os.Getpid()
}

// Stdout is what capvend wrote to its standard output (unless
// Options.Stdout took it).
func (c *Capvend) Stdout() string { return c.stdout.String() }

// Stderr is what capvend wrote to its standard error so far.
func (c *Capvend) Stderr() string { return c.stderr.String() }

// Logs is its log so far, at debug level (a process logs to its standard
// error), empty in a benchmark.
func (c *Capvend) Logs() string {
	if c.cmd != nil {
		return c.Stderr()
	}
	if b, ok := c.logs.(*syncbuf.Buffer); ok {
		return c.Stderr() + b.String()
	}
	return c.Stderr()
}

// URL is the MCP front's URL, as serve said it serves it.
func (c *Capvend) URL() string {
	c.t.Helper()
	const at = "capvend: serving MCP at "
	out := c.Stderr()
	i := strings.Index(out, at)
	if i < 0 {
		c.t.Fatalf("capvend serves no MCP front: %s", out)
	}
	return strings.Fields(out[i+len(at):])[0]
}

// Ledger is the path of its SQLite ledger, from its configuration.
func (c *Capvend) Ledger() string {
	c.t.Helper()
	cfg, err := c.o.Config(c.config, func(string) string { return "" })
	if err != nil {
		c.t.Fatal(err)
	}
	return cfg.Ledger
}

// getenv looks k up in Env.
func (o Options) getenv(k string) string {
	for _, kv := range o.Env {
		if v, ok := strings.CutPrefix(kv, k+"="); ok {
			return v
		}
	}
	return ""
}
