package testnet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Pinned versions of the binaries the stack runs: LNDVersion is the lnd
// whose lnrpc capvend compiles against (see go.mod); BtcdVersion is the
// btcd release built as the chain backend.
const (
	LNDVersion  = "v0.20.2-beta"
	BtcdVersion = "v0.24.2"

	lndModule  = "github.com/lightningnetwork/lnd"
	btcdModule = "github.com/btcsuite/btcd"
	// lndTags are the build tags lnd (and lncli) need for the subservers
	// capvend and gonuts call (router, invoices, wallet kit, ...).
	lndTags = "signrpc walletrpc chainrpc invoicesrpc routerrpc peersrpc"
)

// Binaries are the absolute paths of the external programs the stack runs
// (btcctl and lncli are conveniences for humans; the stack uses RPC).
type Binaries struct {
	Btcd, Btcctl, LND, LNCLI string
}

// DefaultBinDir returns os.UserCacheDir()/capvend/bin, under which each
// binary lives in <name>-<version>/.
func DefaultBinDir() (string, error) {
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testnet: no cache dir: %w", err)
	}
	return filepath.Join(c, "capvend", "bin"), nil
}

// EnsureBinaries returns the btcd/btcctl and lnd/lncli binaries under
// binDir/btcd-<BtcdVersion>/ and binDir/lnd-<LNDVersion>/, building the
// missing ones from the pinned module versions with the go command found in
// PATH (lnd with the tags of its RPC subservers: signrpc walletrpc chainrpc
// invoicesrpc routerrpc peersrpc). Builds write into a temporary directory
// and rename, so an interrupted build never leaves a partial binary; a lock
// file per version directory makes concurrent callers (parallel test
// binaries) wait for one build instead of racing. Progress lines go to
// logf. Safe to call repeatedly: present binaries are reused without
// running go at all.
func EnsureBinaries(ctx context.Context, binDir string, logf func(format string, a ...any)) (Binaries, error) {
	btcdDir := filepath.Join(binDir, "btcd-"+BtcdVersion)
	lndDir := filepath.Join(binDir, "lnd-"+LNDVersion)
	b := Binaries{
		Btcd:   filepath.Join(btcdDir, "btcd"),
		Btcctl: filepath.Join(btcdDir, "btcctl"),
		LND:    filepath.Join(lndDir, "lnd"),
		LNCLI:  filepath.Join(lndDir, "lncli"),
	}
	err := ensureBuilt(ctx, logf, buildSpec{
		dir: btcdDir, module: btcdModule, version: BtcdVersion,
		// "." is btcd itself (named after the module path).
		bins: map[string]string{"btcd": ".", "btcctl": "./cmd/btcctl"},
	})
	if err != nil {
		return b, err
	}
	err = ensureBuilt(ctx, logf, buildSpec{
		dir: lndDir, module: lndModule, version: LNDVersion, tags: lndTags,
		bins: map[string]string{"lnd": "./cmd/lnd", "lncli": "./cmd/lncli"},
	})
	return b, err
}

// buildSpec is one module version whose commands go into dir.
type buildSpec struct {
	dir, module, version, tags string
	bins                       map[string]string // binary name -> package in the module
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Size() > 0
}

func ensureBuilt(ctx context.Context, logf func(string, ...any), spec buildSpec) error {
	what := path.Base(spec.module) + " " + spec.version
	missing := func() (names, pkgs []string) {
		for name, pkg := range spec.bins {
			if !fileExists(filepath.Join(spec.dir, name)) {
				names = append(names, name)
				pkgs = append(pkgs, pkg)
			}
		}
		return names, pkgs
	}
	if names, _ := missing(); len(names) == 0 {
		return nil
	}
	if err := os.MkdirAll(spec.dir, 0o755); err != nil {
		return fmt.Errorf("testnet: build %s: %w", what, err)
	}
	lock := filepath.Join(spec.dir, ".lock")
	unlock, err := lockFile(ctx, lock, func() {
		logf("waiting for another build of %s (lock %s)", what, lock)
	})
	if err != nil {
		return fmt.Errorf("testnet: build %s: %w", what, err)
	}
	defer unlock()
	names, pkgs := missing() // another process may have built them meanwhile
	if len(names) == 0 {
		return nil
	}
	modDir, err := moduleDir(ctx, spec.module, spec.version)
	if err != nil {
		return fmt.Errorf("testnet: build %s: %w", what, err)
	}
	tmp, err := os.MkdirTemp(spec.dir, ".build-")
	if err != nil {
		return fmt.Errorf("testnet: build %s: %w", what, err)
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	slices.Sort(names)
	logf("building %s %s into %s (a cold lnd build takes minutes) ...", strings.Join(names, ", "), spec.version, spec.dir)
	// One go build for all binaries of the module: they share most
	// packages, and the links run in parallel.
	args := []string{"build", "-o", tmp + string(filepath.Separator)}
	if spec.tags != "" {
		args = append(args, "-tags", spec.tags)
	}
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = modDir
	// Build the downloaded module on its own go.mod and go.sum, never
	// the caller's workspace.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stopTick := ticker(func(d time.Duration) { logf("still building %s (%s)", what, d.Round(time.Second)) }, 30*time.Second)
	err = cmd.Run()
	stopTick()
	if err != nil {
		return fmt.Errorf("testnet: build %s: %w\n%s", what, err, tail(out.String(), 4000))
	}
	for _, name := range names {
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(spec.dir, name)); err != nil {
			return fmt.Errorf("testnet: build %s: %w", what, err)
		}
	}
	logf("built %s %s in %s", strings.Join(names, ", "), spec.version, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// moduleDir downloads module@version into the module cache and returns its
// directory. It runs outside any module so the caller's go.mod is untouched.
func moduleDir(ctx context.Context, module, version string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GO111MODULE=on")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &res); jerr == nil && res.Error != "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", module, version, res.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w: %s", module, version, err, tail(stderr.String(), 2000))
	}
	if res.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: no Dir in output", module, version)
	}
	return res.Dir, nil
}

// BuildCapvend builds the capvend command of the module containing the
// current directory (github.com/capvend/capvend/cmd/capvend, by import
// path, from the module's root) into dir/capvend and returns its path. Integration tests
// of other packages call it once from TestMain and pass the result as
// Options.Executable, because the stack runs its mint and relay as
// `capvend testnet mint|relay` processes. It fails if the current directory
// is not inside the capvend module. tags are build tags (crash tests
// build with capvend_failpoints).
func BuildCapvend(ctx context.Context, dir string, tags ...string) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("testnet: go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if root == "." || root == "" {
		return "", fmt.Errorf("testnet: BuildCapvend: not inside a module")
	}
	out := filepath.Join(dir, "capvend")
	args := []string{"build", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "github.com/capvend/capvend/cmd/capvend")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testnet: build capvend: %w\n%s", err, tail(string(b), 4000))
	}
	return out, nil
}

// lockFile takes an exclusive flock on path, waiting while another process
// holds it (calling onWait once). The returned func releases it.
func lockFile(ctx context.Context, path string, onWait func()) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	waited := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !waited && onWait != nil {
			onWait()
			waited = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// ticker calls f every interval with the elapsed time until the returned
// stop func is called; stop waits for the goroutine to exit.
func ticker(f func(time.Duration), interval time.Duration) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				f(time.Since(start))
			}
		}
	}()
	return func() { close(done); <-exited }
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
