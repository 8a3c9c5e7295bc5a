package testnet

import (
	"context"
	"path/filepath"
)

// LitestreamVersion is the Litestream release the backup tests run beside
// capvend (the version docs/OPERATING.md's continuous backup documents).
const LitestreamVersion = "v0.5.18"

const litestreamModule = "github.com/benbjohnson/litestream"

// EnsureLitestream returns the litestream binary under
// binDir/litestream-<LitestreamVersion>/, building it from the pinned
// module version with the go command found in PATH when it is missing
// (about two minutes cold), like EnsureBinaries: into a temporary
// directory and renamed, under a lock file, so concurrent callers wait
// for one build. capvend does not link Litestream: it runs beside serve
// (see docs/OPERATING.md, Continuous backup), so only tests need the binary
// built here; an operator installs Litestream's own release.
func EnsureLitestream(ctx context.Context, binDir string, logf func(format string, a ...any)) (string, error) {
	dir := filepath.Join(binDir, "litestream-"+LitestreamVersion)
	err := ensureBuilt(ctx, logf, buildSpec{
		dir: dir, module: litestreamModule, version: LitestreamVersion,
		bins: map[string]string{"litestream": "./cmd/litestream"},
	})
	return filepath.Join(dir, "litestream"), err
}
