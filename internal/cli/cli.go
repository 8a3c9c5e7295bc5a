// Package cli is capvend's command line: serve, demo, init, doctor, the
// ledger, refunds, credit, l402, cashu, reconcile and testnet commands,
// and their configuration. It is where concrete types are wired
// together; cmd/capvend's main calls Main.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"
)

// command is one node of the capvend command tree. A command either runs
// (Run set) or groups subcommands (Subs set); a group run without a
// subcommand prints its help.
type command struct {
	Name    string
	Args    string // positional arguments shown in usage, e.g. "BOLT11"
	Summary string // one line, shown in the parent's list
	Help    string // longer text shown by --help
	// Flags registers the command's flags; the closure captures the
	// variables Run reads.
	Flags func(fs *flag.FlagSet)
	Run   func(ctx context.Context, e *env, args []string) error
	Subs  []*command
}

// env is what a command may touch of the outside world; tests fill it with
// buffers so commands run in-process.
type env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	Log    *slog.Logger
	// ConfigPath is the --config flag (or $CAPVEND_CONFIG); empty means
	// "./capvend.yaml if it exists".
	ConfigPath string
	// lockWait, if set, replaces serveLockWait (tests).
	lockWait time.Duration
}

// exitError carries a specific exit status (e.g. `ledger verify` found
// problems: 1; usage errors: 2).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError marks a mistake in how the command was called; it exits 2.
func usageError(format string, a ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, a...)}
}

// execute runs the command tree against args (without the program name) and
// returns the process exit status.
func execute(ctx context.Context, root *command, e *env, args []string) int {
	err := dispatch(ctx, root, e, []string{root.Name}, args)
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	code := 1
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintf(e.Stderr, "capvend: %s\n", msg)
	}
	return code
}

func dispatch(ctx context.Context, c *command, e *env, path []string, args []string) error {
	fs := flag.NewFlagSet(strings.Join(path, " "), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if c.Flags != nil {
		c.Flags(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(e.Stdout, c, path, fs)
			return flag.ErrHelp
		}
		return usageError("%v (see '%s --help')", err, strings.Join(path, " "))
	}
	rest := fs.Args()
	if len(c.Subs) > 0 {
		if len(rest) == 0 {
			if c.Run != nil {
				return c.Run(ctx, e, rest)
			}
			printHelp(e.Stdout, c, path, fs)
			return nil
		}
		name := rest[0]
		if name == "help" {
			printHelp(e.Stdout, c, path, fs)
			return nil
		}
		for _, s := range c.Subs {
			if s.Name == name {
				return dispatch(ctx, s, e, append(path, name), rest[1:])
			}
		}
		return usageError("unknown command %q for '%s'; commands: %s", name, strings.Join(path, " "), subNames(c))
	}
	if c.Run == nil {
		printHelp(e.Stdout, c, path, fs)
		return nil
	}
	return c.Run(ctx, e, rest)
}

// parseAfterArg parses the flags that follow a command's one argument
// (capvend l402 revoke TOKEN --reason TEXT): the flag package stops at the
// first argument, so args after it are parsed again with register. name
// is the command's path after "capvend", for the help it points to; more
// than one argument is refused with tooMany: "<tooMany>, got "x" too".
func parseAfterArg(name, tooMany string, args []string, register func(fs *flag.FlagSet)) error {
	fs := flag.NewFlagSet("capvend "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	register(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return usageError("%v (see 'capvend %s --help')", err, name)
	}
	if fs.NArg() > 0 {
		return usageError("%s, got %q too", tooMany, fs.Arg(0))
	}
	return nil
}

func subNames(c *command) string {
	names := make([]string, 0, len(c.Subs))
	for _, s := range c.Subs {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func printHelp(w io.Writer, c *command, path []string, fs *flag.FlagSet) {
	usage := strings.Join(path, " ")
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		usage += " [flags]"
	}
	if len(c.Subs) > 0 {
		usage += " COMMAND"
	}
	if c.Args != "" {
		usage += " " + c.Args
	}
	fmt.Fprintf(w, "Usage: %s\n", usage)
	if c.Summary != "" {
		fmt.Fprintf(w, "\n%s\n", c.Summary)
	}
	if c.Help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(c.Help, "\n"))
	}
	if len(c.Subs) > 0 {
		fmt.Fprintf(w, "\nCommands:\n")
		for _, s := range c.Subs {
			fmt.Fprintf(w, "  %-12s %s\n", s.Name, s.Summary)
		}
		fmt.Fprintf(w, "\nRun '%s COMMAND --help' for a command's flags.\n", strings.Join(path, " "))
	}
	if hasFlags {
		fmt.Fprintf(w, "\nFlags:\n")
		fs.VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			line := "  --" + f.Name
			if name != "" {
				line += " " + name
			}
			fmt.Fprintf(w, "%s\n      %s", line, usage)
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(w)
		})
	}
}

// Env is what a run of capvend may touch of the outside world. Main
// fills a nil field from the process: os.Stdin, os.Stdout, os.Stderr,
// os.Getenv, and an info-level text log on Stderr.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	Log    *slog.Logger
	// LockWait, if set, replaces how long serve waits for the serve
	// holding its SQLite ledger (tests).
	LockWait time.Duration
}

// Main runs the command line args (without the program name) until the
// command ends or ctx does, and returns the exit status: 0, 1 when the
// command failed, 2 for a usage error. Errors go to e.Stderr.
func Main(ctx context.Context, args []string, e Env) int {
	in := &env{Stdin: e.Stdin, Stdout: e.Stdout, Stderr: e.Stderr, Getenv: e.Getenv, Log: e.Log, lockWait: e.LockWait}
	if in.Stdin == nil {
		in.Stdin = os.Stdin
	}
	if in.Stdout == nil {
		in.Stdout = os.Stdout
	}
	if in.Stderr == nil {
		in.Stderr = os.Stderr
	}
	if in.Getenv == nil {
		in.Getenv = os.Getenv
	}
	if in.Log == nil {
		in.Log = slog.New(slog.NewTextHandler(in.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return execute(ctx, rootCommand(), in, args)
}
