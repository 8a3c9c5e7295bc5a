package testnet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SharedEnv names the environment variable that points tests at a stack
// already running in a directory (`capvend testnet up --dir DIR`): with
// CAPVEND_TEST_STACK=DIR, Shared returns that stack and never stops it.
const SharedEnv = "CAPVEND_TEST_STACK"

// SharedOptions configure Shared; every field has a default.
type SharedOptions struct {
	// Dir holds the shared stack: its lock and holders file
	// (shared.lock, shared.json), the stack itself (stack/), the capvend
	// binary running its mint and relay (bin/) and the keeper's log.
	// Default: <user cache dir>/capvend/test-stacks/<hash of the module
	// root above the working directory>, so each checkout has its own.
	// Shared also stops and removes abandoned shared stacks (no holder,
	// no run, no keeper alive) in Dir's sibling directories.
	Dir string
	// BinDir is where btcd and lnd are cached (default DefaultBinDir()).
	BinDir string
	// Executable is the capvend binary that runs the mint, the relay and
	// the keeper; default: built from the module into Dir/bin.
	Executable string
	// Progress receives the bring-up's lines; nil discards.
	Progress io.Writer

	reservePorts func(n int) ([]int, error) // see Options
}

// sharedState is DIR/shared.json: who uses the stack and who stops it.
type sharedState struct {
	// Holders are the test binaries using the stack (Shared called,
	// release not yet).
	Holders []Proc `json:"holders"`
	// Runs are the go commands the holders ran under: the stack outlives
	// its holders while one of them runs, for the next package of the
	// same `go test ./...`.
	Runs []Proc `json:"runs"`
	// Keeper stops the stack once holders and runs are gone.
	Keeper Proc `json:"keeper"`
}

// prune drops the processes that are gone (crashed holders included).
func (st *sharedState) prune() {
	gone := func(p Proc) bool { return !p.Alive() }
	st.Holders = slices.DeleteFunc(st.Holders, gone)
	st.Runs = slices.DeleteFunc(st.Runs, gone)
}

func sameProc(a, b Proc) bool { return a.PID == b.PID && a.StartTicks == b.StartTicks }

const (
	sharedLock = "shared.lock"
	sharedFile = "shared.json"
	keeperLog  = "keeper.log"
)

// Shared returns the regtest stack shared by the test binaries of one
// `go test` run, and the function that gives it back. The first caller
// starts it (or reuses a healthy one left by a killed run, or replaces a
// broken one) under a lock file; later callers, in this or in concurrently
// running test binaries, attach to it. Every caller is recorded as a
// holder (pid and start time, so a crashed holder is recognised as gone),
// together with the go command it runs under. A keeper process
// (`capvend testnet keep`) stops the stack and removes Dir once no holder
// is left and those go commands have exited: one stack per `go test
// ./...`, whatever the order of its packages.
//
// With CAPVEND_TEST_STACK=DIR set, Shared returns the stack running in DIR
// instead (ErrNotRunning if there is none); release then only closes the
// connections.
//
// The stack is shared: tests must not stop or restart its nodes, and
// should measure what they paid with Stack.Balance, not ChannelBalance.
// release is idempotent.
func Shared(ctx context.Context, opts SharedOptions) (_ *Stack, release func() error, err error) {
	if dir := os.Getenv(SharedEnv); dir != "" {
		s, err := Load(dir, opts.Progress)
		if err != nil {
			return nil, nil, fmt.Errorf("testnet: %s=%s: %w", SharedEnv, dir, err)
		}
		if !s.Running() {
			s.Release()
			return nil, nil, fmt.Errorf("testnet: %s=%s: the stack is partly dead (see 'capvend testnet status --dir %s')", SharedEnv, dir, dir)
		}
		return s, func() error { s.Release(); return nil }, nil
	}
	if opts.Dir == "" {
		if opts.Dir, err = defaultSharedDir(); err != nil {
			return nil, nil, err
		}
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, nil, fmt.Errorf("testnet: %w", err)
	}
	sweepShared(ctx, filepath.Dir(dir), dir)
	unlock, err := lockShared(ctx, dir, func() {
		fmt.Fprintf(orDiscard(opts.Progress), "testnet: waiting for the shared stack in %s\n", dir)
	})
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	st, err := readShared(dir)
	if err != nil {
		return nil, nil, err
	}
	st.prune()

	exe := func() (string, error) {
		if opts.Executable != "" {
			return opts.Executable, nil
		}
		if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
			return "", fmt.Errorf("testnet: %w", err)
		}
		return BuildCapvend(ctx, filepath.Join(dir, "bin"))
	}
	stackDir := filepath.Join(dir, "stack")
	s := reuseStack(ctx, stackDir, opts.Progress)
	built := ""
	if s == nil {
		if built, err = exe(); err != nil {
			return nil, nil, err
		}
		s, err = Start(ctx, Options{Dir: stackDir, BinDir: opts.BinDir, Executable: built, Progress: opts.Progress, Detach: true, reservePorts: opts.reservePorts})
		if err != nil {
			return nil, nil, err
		}
	}
	if !st.Keeper.Alive() {
		if built == "" {
			if built, err = exe(); err != nil {
				s.Release()
				return nil, nil, err
			}
		}
		if st.Keeper, err = spawn(built, []string{"testnet", "keep", "--dir", dir}, filepath.Join(dir, keeperLog), false); err != nil {
			s.Release()
			if len(st.Holders) == 0 {
				_ = Stop(ctx, stackDir, opts.Progress)
			}
			return nil, nil, fmt.Errorf("testnet: start the shared stack's keeper: %w", err)
		}
	}
	me := selfProc()
	st.Holders = append(st.Holders, me)
	if run, ok := currentRun(); ok && !slices.ContainsFunc(st.Runs, func(p Proc) bool { return sameProc(p, run) }) {
		st.Runs = append(st.Runs, run)
	}
	if err := writeShared(dir, st); err != nil {
		s.Release()
		return nil, nil, err
	}
	var once sync.Once
	release = func() error {
		var err error
		once.Do(func() {
			s.Release()
			err = leaveShared(dir, me)
		})
		return err
	}
	return s, release, nil
}

// reuseStack returns the stack in dir if it finished starting and every
// process answers, else nil (Start then replaces what is left).
func reuseStack(ctx context.Context, dir string, progress io.Writer) *Stack {
	s, err := Load(dir, progress)
	if err != nil {
		return nil
	}
	if s.Info.Ready && s.Running() && s.healthy(ctx) == nil {
		return s
	}
	s.Release()
	return nil
}

// leaveShared removes holder me from dir's holders. The keeper stops the
// stack when it sees nobody left.
func leaveShared(dir string, me Proc) error {
	unlock, err := lockShared(context.Background(), dir, nil)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := readShared(dir)
	if err != nil {
		return err
	}
	// One holding: a process may hold the stack more than once.
	if i := slices.IndexFunc(st.Holders, func(p Proc) bool { return sameProc(p, me) }); i >= 0 {
		st.Holders = slices.Delete(st.Holders, i, i+1)
	}
	st.prune()
	return writeShared(dir, st)
}

// Keep is the keeper of the shared stack in dir (see Shared): every
// keepInterval it checks, under the lock, whether a holder or a run is
// still alive; once none is, it stops the stack, removes dir and returns.
// It returns nil without stopping anything when another keeper took over,
// and ctx's error when ctx ends first.
func Keep(ctx context.Context, dir string, progress io.Writer) error {
	me := selfProc()
	t := time.NewTicker(keepInterval)
	defer t.Stop()
	for {
		done, err := keepOnce(ctx, dir, me, progress)
		if done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// keepInterval is how often the keeper looks; tests shorten it.
var keepInterval = time.Second

func keepOnce(ctx context.Context, dir string, me Proc, out io.Writer) (done bool, err error) {
	if _, err := os.Stat(filepath.Join(dir, sharedLock)); errors.Is(err, os.ErrNotExist) {
		return true, nil // removed: nothing left to keep
	}
	unlock, err := lockShared(ctx, dir, nil)
	if err != nil {
		return false, err
	}
	defer unlock()
	st, err := readShared(dir)
	if err != nil {
		return false, err
	}
	if !sameProc(st.Keeper, me) {
		return true, nil
	}
	st.prune()
	if len(st.Holders) > 0 || len(st.Runs) > 0 {
		return false, nil
	}
	out = orDiscard(out)
	fmt.Fprintf(out, "%s: no test binary holds the stack and their go commands exited: stopping it\n", time.Now().Format(time.RFC3339))
	if err := Stop(ctx, filepath.Join(dir, "stack"), out); err != nil {
		return true, err
	}
	return true, removeShared(dir)
}

// removeShared deletes dir but its lock file, then the lock file: a
// process waiting for the lock then finds it gone and starts afresh (see
// lockShared).
func removeShared(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if e.Name() != sharedLock {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("testnet: remove %s: %w", dir, err)
	}
	_ = os.Remove(filepath.Join(dir, sharedLock))
	_ = os.Remove(dir) // fails if someone created it again meanwhile
	return nil
}

// sweepShared stops the stacks in root's other directories that nobody
// holds and whose keeper is gone (a run killed with its keeper, a deleted
// checkout), and removes them. Directories locked by someone are left.
func sweepShared(ctx context.Context, root, except string) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		if !e.IsDir() || dir == except {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, sharedLock), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close()
			continue
		}
		st, err := readShared(dir)
		if err == nil {
			st.prune()
			if len(st.Holders) == 0 && len(st.Runs) == 0 && !st.Keeper.Alive() {
				if Stop(ctx, filepath.Join(dir, "stack"), nil) == nil {
					_ = removeShared(dir)
				}
			}
		}
		f.Close() // releases the lock
	}
}

// lockShared takes dir's lock file, creating dir if needed. A keeper may
// remove the file while others wait for it; a lock won on a removed file
// protects nothing, so it is taken again on the new one.
func lockShared(ctx context.Context, dir string, onWait func()) (func(), error) {
	for {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("testnet: %w", err)
		}
		path := filepath.Join(dir, sharedLock)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, fmt.Errorf("testnet: %w", err)
		}
		if err := flock(ctx, f, onWait); err != nil {
			f.Close()
			return nil, fmt.Errorf("testnet: lock %s: %w", path, err)
		}
		onWait = nil
		held, err1 := f.Stat()
		now, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			return func() { _ = f.Close() }, nil // closing releases the flock
		}
		f.Close()
	}
}

// flock waits for an exclusive flock on f (calling onWait once if it has
// to wait) until ctx ends.
func flock(ctx context.Context, f *os.File, onWait func()) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != syscall.EWOULDBLOCK {
			return err
		}
		if onWait != nil {
			onWait()
			onWait = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func readShared(dir string) (sharedState, error) {
	var st sharedState
	b, err := os.ReadFile(filepath.Join(dir, sharedFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("testnet: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		// A torn file is impossible (written by rename); a foreign one
		// describes nobody we know: start from an empty state.
		return sharedState{}, nil
	}
	return st, nil
}

func writeShared(dir string, st sharedState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(dir, sharedFile)
	if err := os.WriteFile(p+".tmp", append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("testnet: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("testnet: %w", err)
	}
	return nil
}

// defaultSharedDir is <user cache dir>/capvend/test-stacks/<key>, the key
// naming the module root above the working directory (go test runs a test
// binary in its package's directory), so two checkouts never share.
func defaultSharedDir() (string, error) {
	c, err := os.UserCacheDir()
	if err != nil {
		c = os.TempDir()
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testnet: %w", err)
	}
	root := wd
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			root = dir
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(c, "capvend", "test-stacks", filepath.Base(root)+"-"+hex.EncodeToString(sum[:6])), nil
}

// selfProc is the calling process as a Proc.
func selfProc() Proc {
	p := Proc{PID: os.Getpid()}
	p.StartTicks, _ = startTicks(p.PID)
	return p
}

// currentRun is goRun; tests replace it with a process they control.
var currentRun = goRun

// goRun is the go command running this test binary (its parent, when the
// parent is the go command); false when the binary was started otherwise,
// and then the stack lives only as long as its holders.
func goRun() (Proc, bool) {
	ppid := os.Getppid()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(ppid) + "/comm")
	if err != nil || strings.TrimSpace(string(b)) != "go" {
		return Proc{}, false
	}
	p := Proc{PID: ppid}
	if p.StartTicks, err = startTicks(ppid); err != nil {
		return Proc{}, false
	}
	return p, true
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
