//go:build libsecp256k1

package cli

// A test binary built with the tag libsecp256k1 runs a capvend built with
// it too (builtCapvend), so `go test -tags libsecp256k1 -bench
// NostrFreeCallCPU` measures libsecp256k1's curve arithmetic.
func init() { serveBuildTags = append(serveBuildTags, "libsecp256k1") }
