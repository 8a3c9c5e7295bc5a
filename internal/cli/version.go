package cli

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/mattn/go-sqlite3"
)

// version is set at build time with -ldflags
// "-X github.com/capvend/capvend/internal/cli.version=v1.2.3" (the
// release does: .goreleaser.yaml); otherwise the module version from the
// build info is shown.
var version = ""

func versionCommand() *command {
	return &command{
		Name:    "version",
		Summary: "print capvend's version and the versions of what it is built with",
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("version takes no arguments")
			}
			v := buildVersion()
			bi, ok := debug.ReadBuildInfo()
			fmt.Fprintf(e.Stdout, "capvend %s %s %s/%s\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			sqliteVersion, _, _ := sqlite3.Version()
			fmt.Fprintf(e.Stdout, "  sqlite %s\n", sqliteVersion)
			if ok {
				for _, d := range bi.Deps {
					switch d.Path {
					case "github.com/lightningnetwork/lnd", "github.com/elnosh/gonuts", "github.com/mark3labs/mcp-go",
						"github.com/nbd-wtf/go-nostr", "github.com/mattn/go-sqlite3", "github.com/fiatjaf/khatru":
						fmt.Fprintf(e.Stdout, "  %s %s\n", d.Path, d.Version)
					}
				}
			}
			return nil
		},
	}
}

// buildVersion is capvend's version: set at build time, else the module's.
func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
