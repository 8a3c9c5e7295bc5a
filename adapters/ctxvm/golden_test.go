package ctxvm

import "flag"

// update rewrites the golden files under testdata/golden instead of
// comparing with them: go test ./adapters/ctxvm -run Golden -update
var update = flag.Bool("update", false, "rewrite golden files")
