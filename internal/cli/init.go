package cli

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
)

//go:embed example.yaml
var exampleConfig []byte

func initCommand() *command {
	var out string
	var force, stdout bool
	return &command{
		Name:    "init",
		Summary: "write a commented example configuration",
		Help: `Writes capvend.yaml (or --out FILE) with every setting explained, then
checks that it validates. It refuses to overwrite an existing file unless
--force is given. Edit it: point lnd at your node, list your MCP servers
under upstreams, and set prices.`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&out, "out", "capvend.yaml", "`FILE` to write")
			fs.BoolVar(&force, "force", false, "overwrite an existing file")
			fs.BoolVar(&stdout, "stdout", false, "print the example instead of writing a file")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("init takes no arguments (got %q)", args[0])
			}
			// The example must always be valid: check before writing.
			if _, err := parseConfig(out, exampleConfig, func(string) string { return "" }); err != nil {
				return fmt.Errorf("the built-in example does not validate (a bug): %w", err)
			}
			if stdout {
				_, err := e.Stdout.Write(exampleConfig)
				return err
			}
			flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
			if force {
				flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
			}
			f, err := os.OpenFile(out, flags, 0o600)
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%s exists; use --force to overwrite it", out)
			}
			if err != nil {
				return err
			}
			if _, err := f.Write(exampleConfig); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "wrote %s (it validates). Edit it: point lnd at your node, list your MCP servers under upstreams, set prices.\n", out)
			return nil
		},
	}
}
