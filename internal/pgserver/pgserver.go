// Package pgserver runs a private PostgreSQL server from Debian's
// postgresql package: initdb and pg_ctl on a loopback port, with its data,
// socket and log in one directory, no system service. The ledger's tests
// and `capvend testnet up --postgres` use it. PostgreSQL refuses to run as
// root: as root, the server runs as the postgres user (runuser), which
// owns the directory.
package pgserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/capvend/capvend/internal/freeport"
)

// ErrMissing: initdb and pg_ctl are not installed (apt-get install postgresql).
var ErrMissing = errors.New("PostgreSQL's initdb and pg_ctl are not installed")

// User is the superuser of a server Start creates; it logs in without a
// password from loopback (trust), as the server is private to this machine.
const User = "capvend"

// Server is a running PostgreSQL server.
type Server struct {
	Dir  string // its directory: data/, the socket, log
	Port int    // its loopback TCP port
	bin  string
	as   []string // runuser -u postgres -- when running as root

	noFsync bool
}

// Bin finds the directory of initdb and pg_ctl: on PATH, or Debian's
// /usr/lib/postgresql/<version>/bin. It returns ErrMissing if neither.
func Bin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", ErrMissing
	}
	return filepath.Dir(matches[len(matches)-1]), nil
}

// Options tune Start.
type Options struct {
	// Port to listen on (127.0.0.1); 0 picks a free one.
	Port int
	// NoFsync runs without fsync: for tests, whose subject is the
	// ledger's rules and not the disk's durability.
	NoFsync bool
}

// Init makes sure dir holds a cluster (dir/data, created by initdb if
// missing; dir itself is created if missing) and returns its Server, not
// started: Start starts it with pg_ctl, or run Command in the foreground.
func Init(ctx context.Context, dir string, opts Options) (*Server, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, Port: opts.Port, bin: bin, noFsync: opts.NoFsync}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, and there is no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		s.as = []string{"runuser", "-u", "postgres", "--"}
		if s.Dir, err = s.reachable(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(s.Dir, "data")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if out, err := s.run(ctx, "initdb", "-D", data, "-U", User, "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
			return nil, fmt.Errorf("initdb: %w\n%s", err, out)
		}
	}
	if s.Port == 0 {
		if s.Port, err = freePort(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Start creates a cluster in dir, or reuses the one there (see Init),
// and starts it with pg_ctl; Stop stops it.
func Start(ctx context.Context, dir string, opts Options) (*Server, error) {
	s, err := Init(ctx, dir, opts)
	if err != nil {
		return nil, err
	}
	o := strings.Join(s.settings(), " ")
	if out, err := s.run(ctx, "pg_ctl", "-D", filepath.Join(s.Dir, "data"), "-l", filepath.Join(s.Dir, "log"), "-o", o, "-w", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
		return nil, fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return s, nil
}

// Command is the command line that runs the server in the foreground
// (postgres itself; under root, through runuser): for a supervisor that
// starts and stops processes itself. SIGTERM stops it once its clients
// have disconnected, SIGINT at once.
func (s *Server) Command() []string {
	argv := append(append([]string{}, s.as...), filepath.Join(s.bin, "postgres"), "-D", filepath.Join(s.Dir, "data"))
	return append(argv, s.settings()...)
}

// settings are the server's command-line settings.
func (s *Server) settings() []string {
	o := []string{"-c", "listen_addresses=127.0.0.1", "-p", strconv.Itoa(s.Port), "-k", s.Dir, "-c", "max_connections=200"}
	if s.noFsync {
		o = append(o, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	return o
}

// Ready reports whether the server accepts connections now.
func (s *Server) Ready(ctx context.Context) bool {
	db, err := sql.Open("pgx", s.DSN("postgres"))
	if err != nil {
		return false
	}
	defer db.Close()
	return db.PingContext(ctx) == nil
}

// reachable returns dir if the postgres user can reach it; otherwise (a
// directory under a root-only one, such as a test's temporary directory)
// a directory of the postgres user's under os.TempDir(), which dir/cluster
// then links to: Dir and the link say where the cluster is.
func (s *Server) reachable(dir string, uid, gid int) (string, error) {
	argv := append(append([]string{}, s.as...), "test", "-w", dir)
	if exec.Command(argv[0], argv[1:]...).Run() == nil {
		return dir, nil
	}
	link := filepath.Join(dir, "cluster")
	if target, err := os.Readlink(link); err == nil {
		return target, nil
	}
	home, err := os.MkdirTemp("", "capvend-pg-")
	if err != nil {
		return "", err
	}
	if err := os.Chown(home, uid, gid); err != nil {
		return "", err
	}
	return home, os.Symlink(home, link)
}

// Stop stops the server (fast shutdown: connections are closed, what was
// committed is kept).
func (s *Server) Stop() error {
	out, err := s.run(context.Background(), "pg_ctl", "-D", filepath.Join(s.Dir, "data"), "-m", "fast", "-w", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// DSN is the URL of database db on the server.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", User, s.Port, db)
}

var dbName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// CreateDatabase creates database name (lower-case letters, digits and
// '_') unless it exists, and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	if !dbName.MatchString(name) {
		return "", fmt.Errorf("database name %q: lower-case letters, digits and '_' only", name)
	}
	db, err := sql.Open("pgx", s.DSN("postgres"))
	if err != nil {
		return "", err
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		return "", err
	}
	if n == 0 {
		if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
			return "", err
		}
	}
	return s.DSN(name), nil
}

func (s *Server) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	argv := append(append([]string{}, s.as...), filepath.Join(s.bin, name))
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = os.TempDir() // readable by the postgres user
	out, err := cmd.CombinedOutput()
	return []byte(strings.TrimSpace(string(out))), err
}

func freePort() (int, error) {
	ps, err := freeport.Ports(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// Destroy stops the server and removes its cluster (tests).
func (s *Server) Destroy() error {
	err := s.Stop()
	return errors.Join(err, os.RemoveAll(s.Dir))
}
