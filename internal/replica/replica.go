// Package replica is capvend's side of continuous backup: the SQLite
// ledger is replicated by Litestream running beside capvend serve (its own
// process, with the configuration Config writes), and capvend reads the
// replica through Litestream's command line, its stable interface:
// Restore brings a ledger back (`litestream restore`), Newest says how far
// the replica reaches (`litestream ltx -json`).
//
// Why beside and not linked in: Litestream's library opens the database
// with its own copy of SQLite (modernc.org/sqlite) and documents that an
// application linking it must use that driver too, because POSIX locks
// belong to the process: closing one copy's file descriptor drops the
// other copy's locks on the same file (sqlite.org/howtocorrupt.html,
// 2.2.1). capvend's ledger is mattn/go-sqlite3; two SQLite libraries on
// one file in one process is a way to corrupt the books. As its own
// process, Litestream holds its read lock and runs its checkpoints as
// designed, and capvend links nothing of it.
//
// A replica is a URL: file:///ABSOLUTE/PATH, or s3://BUCKET/PATH (with
// Litestream's query options for S3-compatible stores, such as
// ?endpoint=http://127.0.0.1:9000&region=us-east-1&force-path-style=true).
// S3 credentials come from a file of KEY=VALUE lines (the format of
// systemd's EnvironmentFile=, so the same file serves the Litestream
// unit), passed to the litestream child in its environment, never on its
// command line or in an error.
package replica

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Errors.
var (
	// ErrNoReplica: the replica holds no backup of the ledger (nothing
	// was ever replicated there, or not before the point asked for).
	ErrNoReplica = errors.New("the replica holds no backup")
	// ErrNoLitestream: the litestream program cannot be found.
	ErrNoLitestream = errors.New("litestream is not installed")
)

// ParseURL checks a replica URL: file:// with an absolute path and no
// host, or s3:// with a bucket. It returns the URL, or an error saying
// what is wrong (the URL holds no secret: credentials come from a file).
func ParseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL: %w", s, err)
	}
	if u.User != nil {
		return nil, errors.New("credentials do not belong in the URL: put them in ledger.replica_credentials_file")
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || !filepath.IsAbs(u.Path) {
			return nil, fmt.Errorf("%q: a file replica is file:///ABSOLUTE/PATH", s)
		}
	case "s3":
		if u.Host == "" {
			return nil, fmt.Errorf("%q: an S3 replica is s3://BUCKET/PATH", s)
		}
	default:
		return nil, fmt.Errorf("%q: the replica is file:///PATH or s3://BUCKET/PATH", s)
	}
	return u, nil
}

// credentialKey is a variable a credentials file may set: the AWS SDK's
// and Litestream's own.
var credentialKey = regexp.MustCompile(`^(AWS|LITESTREAM)_[A-Z0-9_]+$`)

// ReadCredentials reads a credentials file: KEY=VALUE lines (blank lines
// and # comments allowed; a value may be quoted), each KEY an AWS_ or
// LITESTREAM_ variable, such as AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY. It returns them as environment entries. Errors
// name the line, never its value.
func ReadCredentials(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var env []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		k = strings.TrimSpace(k)
		if !ok || !credentialKey.MatchString(k) {
			return nil, fmt.Errorf("%s line %d: want KEY=VALUE with KEY an AWS_ or LITESTREAM_ variable", path, n)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env = append(env, k+"="+v)
	}
	if len(env) == 0 {
		return nil, fmt.Errorf("%s sets no variable: want lines AWS_ACCESS_KEY_ID=<id> and AWS_SECRET_ACCESS_KEY=<secret>", path)
	}
	return env, nil
}

// Litestream runs the litestream program against one replica.
type Litestream struct {
	// Bin is the litestream program ("" or a bare name: found in PATH).
	Bin string
	// URL is the replica (ParseURL).
	URL string
	// Env is what the child's environment holds besides PATH and HOME:
	// the credentials (ReadCredentials). Nothing else of capvend's
	// environment is passed on.
	Env []string
}

// command is litestream args with the replica's environment.
func (l Litestream) command(ctx context.Context, args ...string) (*exec.Cmd, error) {
	bin := l.Bin
	if bin == "" {
		bin = "litestream"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%w (%s): install Litestream %s, or name the program in ledger.litestream", ErrNoLitestream, bin, Version)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, l.Env...)
	return cmd, nil
}

// Version is the Litestream release capvend is tested with.
const Version = "v0.5.18"

// run runs litestream args and returns its standard output; an error
// carries the end of its standard error (Litestream's messages name
// paths and URLs, never the credentials it was given by environment).
func (l Litestream) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd, err := l.command(ctx, args...)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = "..." + msg[len(msg)-2000:]
		}
		return stdout.Bytes(), fmt.Errorf("litestream %s: %w: %s", args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// Restore writes the ledger the replica holds to out, a path that must
// not exist: the newest state, or with a non-zero at the state as of that
// time (Litestream's point in time: the last transaction replicated at or
// before it). It returns ErrNoReplica when the replica has no backup (of
// that time). out is written by Litestream alone; the caller verifies it.
func (l Litestream) Restore(ctx context.Context, out string, at time.Time) error {
	args := []string{"restore", "-o", out}
	if !at.IsZero() {
		args = append(args, "-timestamp", at.UTC().Format(time.RFC3339Nano))
	}
	_, err := l.run(ctx, append(args, l.URL)...)
	if err != nil && noBackup(err) {
		return fmt.Errorf("%w at %s: %w", ErrNoReplica, l.Redacted(), err)
	}
	return err
}

// noBackup reports whether a litestream error says there was nothing to
// restore.
func noBackup(err error) bool {
	s := err.Error()
	return strings.Contains(s, "no matching backup") || strings.Contains(s, "no snapshots") ||
		strings.Contains(s, "transaction not available") || strings.Contains(s, "no backups found")
}

// Position is how far a replica reaches.
type Position struct {
	// TXID is the newest transaction replicated (Litestream's id, 0 if
	// none).
	TXID uint64
	// Time is when the newest file of the replica was written (to the
	// second: Litestream lists them in RFC 3339).
	Time time.Time
	// Files is how many files the replica holds, over every level.
	Files int
}

// Newest reads how far the replica reaches, from the list of its files
// (`litestream ltx -json -level all`). A replica holding nothing is the
// zero Position.
func (l Litestream) Newest(ctx context.Context) (Position, error) {
	out, err := l.run(ctx, "ltx", "-json", "-level", "all", l.URL)
	if err != nil {
		return Position{}, err
	}
	var files []struct {
		MaxTXID   string `json:"max_txid"`
		Timestamp string `json:"timestamp"`
	}
	if err := json.Unmarshal(out, &files); err != nil {
		return Position{}, fmt.Errorf("litestream ltx: unexpected output: %w", err)
	}
	var p Position
	p.Files = len(files)
	for _, f := range files {
		tx, err := strconv.ParseUint(f.MaxTXID, 16, 64)
		if err != nil {
			return Position{}, fmt.Errorf("litestream ltx: transaction id %q: %w", f.MaxTXID, err)
		}
		ts, err := time.Parse(time.RFC3339, f.Timestamp)
		if err != nil {
			return Position{}, fmt.Errorf("litestream ltx: timestamp %q: %w", f.Timestamp, err)
		}
		p.TXID = max(p.TXID, tx)
		if ts.After(p.Time) {
			p.Time = ts
		}
	}
	return p, nil
}

// Redacted is the replica's URL without its query (where an endpoint's
// options live), for messages.
func (l Litestream) Redacted() string {
	u, err := url.Parse(l.URL)
	if err != nil {
		return "(replica)"
	}
	u.RawQuery = ""
	return u.String()
}

// Config is the Litestream configuration (litestream.yml) that replicates
// the ledger at dbPath to the replica url: what `litestream replicate
// -config FILE` runs beside capvend serve. Credentials are not in it:
// Litestream reads them from its environment (the credentials file as
// the systemd unit's EnvironmentFile=).
func Config(dbPath, replicaURL string) string {
	return fmt.Sprintf(`# Litestream %s configuration for capvend's ledger (capvend ledger
# litestream-config). Run beside capvend serve:
#   litestream replicate -config litestream.yml
# S3 credentials come from the environment (AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY): the file ledger.replica_credentials_file names,
# as the unit's EnvironmentFile=.
dbs:
  - path: %s
    replica:
      url: %s
`, Version, strconv.Quote(dbPath), strconv.Quote(replicaURL))
}
