package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/capvend/capvend/internal/capvendtest"
)

// startCapvend is capvendtest.Start with this package's capvend: cli.Main
// in this process, builtCapvend as a process (capvendtest.Options says
// the rest).
func startCapvend(t testing.TB, config string, opts ...capvendtest.Options) *capvendtest.Capvend {
	t.Helper()
	return capvendtest.Start(t, config, withCLI(opts))
}

// withCLI is the first of opts (or none), with its Main, Binary and
// Config this package's.
func withCLI(opts []capvendtest.Options) capvendtest.Options {
	var o capvendtest.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	o.Main = func(ctx context.Context, args []string, p capvendtest.Proc) int {
		return Main(ctx, args, Env(p))
	}
	o.Binary = builtCapvend
	o.Config = func(path string, getenv func(string) string) (capvendtest.Fronts, error) {
		cfg, err := loadConfig(path, getenv)
		if err != nil {
			return capvendtest.Fronts{}, err
		}
		return capvendtest.Fronts{HTTP: cfg.HTTP.Listen != "", Nostr: len(cfg.Nostr.Relays) > 0, Ledger: cfg.Ledger.Path}, nil
	}
	return o
}

// run runs capvend with args in this process and returns its standard
// output, its standard error and its exit code; environ is all of its
// environment.
func run(t testing.TB, environ map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	o := capvendtest.Options{Args: append([]string{}, args...)}
	for k, v := range environ {
		o.Env = append(o.Env, k+"="+v)
	}
	c := startCapvend(t, "", o)
	code = c.Wait()
	return c.Stdout(), c.Stderr(), code
}

// capvendIn runs the built capvend binary with args in dir, as a user at a
// shell there would (capvendtest.Options.UserShell) with env, and returns its
// standard output; a non-zero exit fails the test.
func capvendIn(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	c := startCapvend(t, "", capvendtest.Options{Args: append([]string{}, args...), Process: true, UserShell: true, Dir: dir, Env: env})
	if code := c.Wait(); code != 0 {
		t.Fatalf("capvend %s (in %s) exited %d\n%s%s", strings.Join(args, " "), dir, code, c.Stdout(), c.Stderr())
	}
	return c.Stdout()
}

// capvendFails is capvendIn of a command that must exit non-zero; it
// returns the command's standard output and error.
func capvendFails(t testing.TB, dir string, args ...string) string {
	t.Helper()
	c := startCapvend(t, "", capvendtest.Options{Args: append([]string{}, args...), Process: true, UserShell: true, Dir: dir})
	if code := c.Wait(); code == 0 {
		t.Fatalf("capvend %s: exit 0, want a non-zero exit\n%s%s", strings.Join(args, " "), c.Stdout(), c.Stderr())
	}
	return c.Stdout() + c.Stderr()
}
