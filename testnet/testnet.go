// Package testnet runs capvend's local regtest network: btcd, three LND
// nodes (vendor, customer, mint) with funded wallets and open channels, a
// Cashu mint backed by the mint node, and a Nostr relay, all on 127.0.0.1;
// with Options.NWC also an NWC wallet service in front of the vendor node
// (nwc.go, testnet/nwc). docs/TESTING.md, "The regtest stack", has more.
//
// # Use
//
// The same code serves the `capvend testnet` CLI, which leaves the stack
// running detached, and integration tests, which call Start from TestMain
// and Close at the end. Every process leads its own process group and is
// recorded (pid and start time) in DIR/testnet.json, from which Load
// reattaches. One stack per test binary, from another package's TestMain
// (testnet/teststack shares one among the test binaries of a run):
//
//	func TestMain(m *testing.M) {
//		ctx := context.Background()
//		tmp, _ := os.MkdirTemp("", "capvend-it-")
//		exe, err := testnet.BuildCapvend(ctx, tmp) // runs mint and relay
//		if err != nil {
//			log.Fatal(err)
//		}
//		stack, err = testnet.Start(ctx, testnet.Options{
//			Dir: filepath.Join(tmp, "stack"), Executable: exe, Progress: os.Stderr,
//		})
//		if err != nil {
//			log.Fatal(err) // Start already stopped what it started
//		}
//		code := m.Run()
//		if err := stack.Close(); err != nil {
//			log.Print(err)
//		}
//		os.RemoveAll(tmp)
//		os.Exit(code)
//	}
//
// Tests then use stack.Conn(testnet.Vendor) (admin gRPC), stack.Node(...)
// (hosts, TLS cert, macaroon paths), stack.Pay, stack.Invoice,
// stack.CashuMint, stack.Mine, stack.MintURL and stack.RelayURL.
package testnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// Node names of the stack.
const (
	Vendor   = "vendor"   // the seller: capvend's LND backend
	Customer = "customer" // pays
	MintNode = "mint"     // backs the Cashu mint
)

// InfoFile is the name of the stack description inside the stack directory.
const InfoFile = "testnet.json"

// Options configure Start. Only Dir is required.
type Options struct {
	// Dir holds the stack's data, logs and testnet.json. Start creates it.
	Dir string
	// BinDir is where btcd and lnd binaries are cached (default
	// DefaultBinDir()).
	BinDir string
	// Executable is the capvend binary that runs the mint and the relay
	// (`capvend testnet mint|relay`); default os.Executable(). Tests must
	// set it (see BuildCapvend): a test binary is not capvend.
	Executable string
	// Progress receives one line per step with the elapsed time; nil
	// discards.
	Progress io.Writer
	// ChannelSats is the capacity of each channel (default 10,000,000).
	ChannelSats int64
	// PushSats is pushed to the remote side of each channel so the vendor
	// can refund and the mint can melt (default 4,000,000).
	PushSats int64
	// Detach leaves the processes running when the calling process exits
	// (the CLI's `up`). Without it each process gets SIGTERM from the
	// kernel when the caller dies, so a crashed or timed-out test binary
	// does not leak a stack; Close is still the normal way to stop it.
	Detach bool
	// Postgres also starts a PostgreSQL server (Debian's postgresql
	// package: initdb, postgres) on a loopback port, its cluster in
	// DIR/postgres, with an empty database "capvend"; its DSN is in
	// testnet.json (Info.Postgres).
	Postgres bool
	// RelayMaxMessage, when positive, is the largest websocket message the
	// stack's relay reads (larger ones close the sender's connection, as
	// on public relays), advertised in its NIP-11 document as
	// limitation.max_message_length; 0: khatru's own limit (512,000
	// bytes), not advertised.
	RelayMaxMessage int
	// NWC also runs an NWC wallet service (testnet/nwc: Alby's
	// NWCWalletService, node and its npm packages) in front of the
	// vendor node, on the stack's relay; its connection URIs are in
	// testnet.json (Info.NWC).
	NWC bool

	// reservePorts replaces freePorts in tests (to force a port clash).
	reservePorts func(n int) ([]int, error)
}

// BtcdInfo describes the btcd process.
type BtcdInfo struct {
	RPCHost string `json:"rpc_host"` // JSON-RPC over TLS, 127.0.0.1:PORT
	RPCUser string `json:"rpc_user"`
	// RPCPass is a random per-stack password (regtest only).
	RPCPass string `json:"rpc_pass"`
	RPCCert string `json:"rpc_cert"` // btcd's self-signed TLS certificate
	P2PHost string `json:"p2p_host"`
	DataDir string `json:"data_dir"`
	// MiningAddrs are btcd's --miningaddr values: a key of Start's that
	// is discarded once the lnd wallets are funded; coinbases of later
	// blocks (Mine) are unspendable by the stack.
	MiningAddrs []string `json:"mining_addrs"`
	Proc
}

// NodeInfo describes one LND node. Hosts are 127.0.0.1:PORT; paths are
// absolute. Dial the gRPC host with DialLND (or Stack.Conn for admin).
type NodeInfo struct {
	Name             string `json:"name"`   // Vendor, Customer or MintNode
	Pubkey           string `json:"pubkey"` // identity key, hex
	RPCHost          string `json:"rpc_host"`
	RESTHost         string `json:"rest_host"`
	P2PHost          string `json:"p2p_host"`
	Dir              string `json:"dir"` // --lnddir
	TLSCert          string `json:"tls_cert"`
	AdminMacaroon    string `json:"admin_macaroon"`
	InvoiceMacaroon  string `json:"invoice_macaroon"`
	ReadonlyMacaroon string `json:"readonly_macaroon"`
	Proc
}

// ServiceInfo describes the mint or the relay process.
type ServiceInfo struct {
	URL     string `json:"url"`                // http://127.0.0.1:PORT (mint), ws://127.0.0.1:PORT (relay)
	Listen  string `json:"listen"`             // 127.0.0.1:PORT
	DataDir string `json:"data_dir,omitempty"` // the mint's database; the relay keeps events in memory
	// MaxMessage is the relay's advertised message limit (0: none).
	MaxMessage int `json:"max_message_length,omitempty"`
	Proc
}

// ChannelInfo describes one channel opened by Start.
type ChannelInfo struct {
	From      string `json:"from"`       // funder (Customer)
	To        string `json:"to"`         // Vendor or MintNode
	ChanPoint string `json:"chan_point"` // txid:index
	ChanID    uint64 `json:"chan_id"`    // short channel id
	Capacity  int64  `json:"capacity"`   // sats
	PushSats  int64  `json:"push_sats"`  // initial balance of To
}

// Info is the content of DIR/testnet.json: every endpoint, credential path
// and pid of a running stack.
type Info struct {
	Version int `json:"version"` // format version, 1
	// Ready is set once Start has finished; a file without it describes
	// a bring-up that died midway (its processes are stopped by the next
	// Start or Stop).
	Ready     bool          `json:"ready"`
	Dir       string        `json:"dir"`
	StartedAt time.Time     `json:"started_at"`
	Btcd      BtcdInfo      `json:"btcd"`
	Nodes     []NodeInfo    `json:"nodes"`
	Mint      ServiceInfo   `json:"mint"`
	Relay     ServiceInfo   `json:"relay"`
	Channels  []ChannelInfo `json:"channels"`
	// Postgres is the PostgreSQL server of a stack started with
	// Options.Postgres; nil otherwise.
	Postgres *PostgresInfo `json:"postgres,omitempty"`
	// NWC is the NWC wallet service of a stack started with
	// Options.NWC; nil otherwise.
	NWC *NWCInfo `json:"nwc,omitempty"`
}

// PostgresInfo describes the stack's PostgreSQL server.
type PostgresInfo struct {
	// DSN is the URL of its database "capvend" (user capvend, no
	// password: the server trusts loopback), for ledger.dsn_file.
	DSN     string `json:"dsn"`
	Listen  string `json:"listen"`   // 127.0.0.1:PORT
	DataDir string `json:"data_dir"` // the cluster (DIR/postgres, or where it links to under root)
	Proc
}

// Stack is a running regtest stack. Its methods are safe for concurrent
// use. It owns gRPC connections (closed by Close or Release) and, unless
// released, the processes listed in Info.
type Stack struct {
	// Info describes the stack; read-only after Start or Load.
	Info Info
	// MintURL is the Cashu mint, http://127.0.0.1:PORT.
	MintURL string
	// RelayURL is the Nostr relay, ws://127.0.0.1:PORT.
	RelayURL string

	out    io.Writer
	outMu  sync.Mutex // logf's writes: stopAll logs from one goroutine per process
	start  time.Time
	detach bool
	owned  bool // Start started its processes (not reattached with Load)

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	btc    *btcdRPC
	closed bool

	own ownLedger // what this Stack value paid and invoiced: see Balance
}

// ComponentError is a failure of one component of the stack; Log is the
// file to read.
type ComponentError struct {
	Component string // e.g. "btcd", "lnd vendor", "cashu mint", "relay", "build"
	Log       string // log file of the component; empty if none
	Err       error
}

func (e *ComponentError) Error() string {
	if e.Log == "" {
		return fmt.Sprintf("testnet: %s: %v", e.Component, e.Err)
	}
	return fmt.Sprintf("testnet: %s: %v (log: %s)", e.Component, e.Err, e.Log)
}

func (e *ComponentError) Unwrap() error { return e.Err }

// ErrNotRunning is returned by Load when DIR/testnet.json is absent or
// describes a stack none of whose processes run.
var ErrNotRunning = errors.New("testnet: no running stack")

// Node returns the node called name (Vendor, Customer or MintNode).
func (s *Stack) Node(name string) (NodeInfo, bool) {
	for _, n := range s.Info.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return NodeInfo{}, false
}

func (s *Stack) mustNode(name string) (NodeInfo, error) {
	n, ok := s.Node(name)
	if !ok {
		return NodeInfo{}, fmt.Errorf("testnet: no node %q", name)
	}
	return n, nil
}

// Conn returns a shared admin gRPC connection to the node called name. The
// Stack owns it: callers must not close it.
func (s *Stack) Conn(name string) (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("testnet: stack closed")
	}
	if c, ok := s.conns[name]; ok {
		return c, nil
	}
	n, ok := s.Node(name)
	if !ok {
		return nil, fmt.Errorf("testnet: no node %q", name)
	}
	c, err := DialLND(n.RPCHost, n.TLSCert, n.AdminMacaroon)
	if err != nil {
		return nil, err
	}
	if s.conns == nil {
		s.conns = map[string]*grpc.ClientConn{}
	}
	s.conns[name] = c
	return c, nil
}

func (s *Stack) btcd() (*btcdRPC, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.btc != nil {
		return s.btc, nil
	}
	b := s.Info.Btcd
	c, err := newBtcdRPC(b.RPCHost, b.RPCUser, b.RPCPass, b.RPCCert)
	if err != nil {
		return nil, &ComponentError{Component: "btcd", Log: b.Log, Err: err}
	}
	s.btc = c
	return c, nil
}

// procs lists the stack's processes in stop order: services first, the
// chain backend last.
func (s *Stack) procs() []namedProc {
	var ps []namedProc
	if n := s.Info.NWC; n != nil && n.PID != 0 {
		ps = append(ps, namedProc{"nwc wallet", n.Proc})
	}
	if s.Info.Mint.PID != 0 {
		ps = append(ps, namedProc{"cashu mint", s.Info.Mint.Proc})
	}
	if s.Info.Relay.PID != 0 {
		ps = append(ps, namedProc{"relay", s.Info.Relay.Proc})
	}
	if pg := s.Info.Postgres; pg != nil && pg.PID != 0 {
		ps = append(ps, namedProc{"postgres", pg.Proc})
	}
	for _, n := range s.Info.Nodes {
		if n.PID != 0 {
			ps = append(ps, namedProc{"lnd " + n.Name, n.Proc})
		}
	}
	if s.Info.Btcd.PID != 0 {
		ps = append(ps, namedProc{"btcd", s.Info.Btcd.Proc})
	}
	return ps
}

type namedProc struct {
	name string
	Proc
}

// Release closes the Stack's gRPC connections and leaves the processes
// running (the CLI's `up`). The Stack is unusable afterwards.
func (s *Stack) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
	s.closed = true
}

// Close stops every process of the stack (whether this Stack started them
// or reattached with Load): SIGTERM to each process group, then SIGKILL
// after 30 s, waiting until each recorded pid is gone. It then removes
// testnet.json so the directory no longer describes a running stack. It is
// idempotent; the error lists processes that could not be stopped.
func (s *Stack) Close() error {
	s.Release()
	err := stopAll(s.procs(), s.logf)
	if err == nil && s.Info.Dir != "" {
		_ = os.Remove(filepath.Join(s.Info.Dir, InfoFile))
	}
	return err
}

// Stop stops the stack recorded in dir (see Close), serialised with Start
// on the same dir by a lock file. A dir without a running stack is not an
// error: its stale testnet.json, if any, is removed. Survivors of a partly
// dead stack are stopped.
func Stop(ctx context.Context, dir string, progress io.Writer) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "lock"), nil)
	if err != nil {
		return fmt.Errorf("testnet: lock %s: %w", dir, err)
	}
	defer unlock()
	s, err := Load(dir, progress)
	if errors.Is(err, ErrNotRunning) {
		if s != nil {
			_ = os.Remove(filepath.Join(dir, InfoFile))
		}
		return nil
	}
	if err != nil {
		return err
	}
	return s.Close()
}

// stopAll stops services and lnd nodes concurrently, then btcd (lnd shuts
// down faster with its backend still up).
func stopAll(ps []namedProc, logf func(string, ...any)) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	stop := func(p namedProc) {
		defer wg.Done()
		if !p.Alive() {
			return
		}
		if err := p.stop(30 * time.Second); err != nil {
			mu.Lock()
			errs = append(errs, &ComponentError{Component: p.name, Log: p.Log, Err: err})
			mu.Unlock()
			return
		}
		logf("stopped %s (pid %d)", p.name, p.PID)
	}
	var last []namedProc
	for _, p := range ps {
		if p.name == "btcd" {
			last = append(last, p)
			continue
		}
		wg.Add(1)
		go stop(p)
	}
	wg.Wait()
	for _, p := range last {
		wg.Add(1)
		stop(p)
	}
	return errors.Join(errs...)
}

// Running reports whether every process of the stack is alive.
func (s *Stack) Running() bool {
	ps := s.procs()
	if len(ps) == 0 {
		return false
	}
	for _, p := range ps {
		if !p.Alive() {
			return false
		}
	}
	return true
}

func (s *Stack) logf(format string, a ...any) {
	if s.out == nil {
		return
	}
	line := fmt.Sprintf("[%5.1fs] testnet: %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, a...))
	s.outMu.Lock()
	defer s.outMu.Unlock()
	io.WriteString(s.out, line)
}

// Load reattaches to the stack described by dir/testnet.json. It returns
// ErrNotRunning (wrapped) if the file is missing or none of its processes
// is alive; a partly dead stack is returned as is (see Running). Progress
// lines of later operations (Close, Mine ...) go to progress (nil
// discards).
func Load(dir string, progress io.Writer) (*Stack, error) {
	b, err := os.ReadFile(filepath.Join(dir, InfoFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNotRunning, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("testnet: parse %s: %w", filepath.Join(dir, InfoFile), err)
	}
	s := newStack(info, progress)
	anyAlive := false
	for _, p := range s.procs() {
		if p.Alive() {
			anyAlive = true
		}
	}
	if !anyAlive {
		return s, fmt.Errorf("%w in %s (stale %s)", ErrNotRunning, dir, InfoFile)
	}
	return s, nil
}

func newStack(info Info, progress io.Writer) *Stack {
	return &Stack{
		Info:     info,
		MintURL:  info.Mint.URL,
		RelayURL: info.Relay.URL,
		out:      progress,
		start:    time.Now(),
	}
}

func (s *Stack) writeInfo() error {
	b, err := json.MarshalIndent(s.Info, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(s.Info.Dir, InfoFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// ProcStatus is the state of one process of the stack.
type ProcStatus struct {
	Name  string
	PID   int
	Alive bool
	RSSKB int64
	Log   string
}

// Processes reports every process of the stack with its resident memory.
func (s *Stack) Processes() []ProcStatus {
	var out []ProcStatus
	for _, p := range s.procs() {
		out = append(out, ProcStatus{Name: p.name, PID: p.PID, Alive: p.Alive(), RSSKB: p.rssKB(), Log: p.Log})
	}
	return out
}

// DeadReport describes the stack's processes that are no longer running,
// each with the end of its log (at most n bytes of it): "" when every
// process runs. A test run that failed prints it, since the stack's
// directory, logs included, is removed once the run ends.
func (s *Stack) DeadReport(n int) string {
	var b strings.Builder
	for _, p := range s.procs() {
		if p.Alive() {
			continue
		}
		fmt.Fprintf(&b, "testnet: %s (pid %d) is not running; the end of its log %s:\n", p.name, p.PID, p.Log)
		data, err := os.ReadFile(p.Log)
		if err != nil {
			fmt.Fprintf(&b, "  (%v)\n", err)
			continue
		}
		b.WriteString(tail(string(data), n))
		if len(data) > 0 && data[len(data)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String()
}
