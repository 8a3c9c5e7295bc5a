// Package racesupp lets test binaries built with -race run with the race
// detector's suppressions of known data races inside third-party code,
// and nothing else. A TestMain calls Reexec first:
//
//	func TestMain(m *testing.M) {
//		racesupp.Reexec()
//		os.Exit(m.Run())
//	}
//
// Without -race, or when GORACE already names a suppressions file, Reexec
// does nothing. Otherwise it writes suppressions.txt (embedded here) to
// the temporary directory and executes the test binary again, same
// arguments, with GORACE="... suppressions=<that file>": the race runtime
// reads GORACE only when the process starts. So `go test -race ./...`
// needs no environment of its own.
//
// Only races whose stacks run through the functions listed in
// suppressions.txt are suppressed: each entry is anchored (^...$) to one
// function that only the library's own goroutines run and that calls no
// code of capvend, and says which upstream bug it stands for. Races in
// capvend's own code, and between capvend's code and a library (including
// capvend's hooks called by the library), are still reported. Production
// code never imports this package.
package racesupp

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

//go:embed suppressions.txt
var suppressions []byte

// Enabled reports whether the binary was built with -race.
const Enabled = raceEnabled

// Reexec re-executes the running test binary with the suppressions in
// GORACE when it was built with -race and they are not in force yet. It
// returns only when there is nothing to do, or when re-executing failed
// (then the binary runs on without suppressions and says why on stderr).
func Reexec() {
	if !Enabled || strings.Contains(os.Getenv("GORACE"), "suppressions=") {
		return
	}
	path, err := writeSuppressions()
	if err == nil {
		var exe string
		if exe, err = os.Executable(); err == nil {
			gorace := strings.TrimSpace(os.Getenv("GORACE") + " suppressions=" + path)
			env := append(os.Environ(), "GORACE="+gorace)
			err = syscall.Exec(exe, os.Args, env)
		}
	}
	fmt.Fprintf(os.Stderr, "racesupp: running without the race suppressions of third-party code: %v\n", err)
}

// writeSuppressions writes the suppressions to a file named by their
// hash (so concurrent test binaries share it) and returns its path.
func writeSuppressions() (string, error) {
	sum := sha256.Sum256(suppressions)
	path := filepath.Join(os.TempDir(), "capvend-race-"+hex.EncodeToString(sum[:8])+".supp")
	if b, err := os.ReadFile(path); err == nil && string(b) == string(suppressions) {
		return path, nil
	}
	tmp, err := os.CreateTemp(os.TempDir(), "capvend-race-*.supp")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(suppressions); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp.Name(), path)
}
