package testnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/lightningnetwork/lnd/lnrpc"
	"golang.org/x/sync/errgroup"

	"github.com/capvend/capvend/internal/freeport"
)

// Bring-up limits. Generous: CI machines are slow and share CPU with builds.
const (
	initialBlocks  = 500 // segwit activates around block 432 on btcd regtest
	readyTimeout   = 2 * time.Minute
	channelTimeout = 3 * time.Minute
)

// Start brings up the stack in opts.Dir and returns once both channels are
// active in both directions and the mint and relay answer. If dir already
// holds a running stack, Start reattaches to it instead (idempotent). A
// stale testnet.json (its processes dead) is cleaned up: surviving
// processes of it are stopped and the old data removed, then a fresh stack
// starts. On any failure Start stops every process it started and returns
// a *ComponentError naming the component and its log file. The processes
// run detached in their own process groups: cancelling ctx aborts Start
// (tearing down) but does not affect a stack Start already returned.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if opts.Dir == "" {
		return nil, errors.New("testnet: Options.Dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	if opts.ChannelSats == 0 {
		opts.ChannelSats = 10_000_000
	}
	if opts.PushSats == 0 {
		opts.PushSats = 4_000_000
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = DefaultBinDir(); err != nil {
			return nil, err
		}
	}
	if opts.Executable == "" {
		if opts.Executable, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("testnet: find capvend executable: %w", err)
		}
	}
	s := newStack(Info{Version: 1, Dir: dir}, opts.Progress)
	s.detach, s.owned = opts.Detach, true
	if s.out == nil {
		s.out = io.Discard
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "lock"), func() {
		s.logf("waiting for another testnet command on %s", dir)
	})
	if err != nil {
		return nil, fmt.Errorf("testnet: lock %s: %w", dir, err)
	}
	defer unlock()

	// Idempotent up: reattach to a healthy running stack.
	if old, lerr := Load(dir, opts.Progress); lerr == nil {
		old.start = s.start
		// A stack without the PostgreSQL server asked for is replaced.
		if old.Info.Ready && old.Running() && old.healthy(ctx) == nil && (old.Info.Postgres != nil || !opts.Postgres) &&
			old.Info.Relay.MaxMessage == opts.RelayMaxMessage && (old.Info.NWC != nil || !opts.NWC) {
			old.logf("stack in %s is already running", dir)
			return old, nil
		}
		old.Release()
		old.logf("stack in %s is incomplete or partly dead; stopping what is left", dir)
		if err := stopAll(old.procs(), old.logf); err != nil {
			return nil, err
		}
	} else if old != nil {
		s.logf("removing stale %s", filepath.Join(dir, InfoFile))
	}
	if err := cleanDir(dir); err != nil {
		return nil, err
	}

	defer func() {
		if err != nil {
			s.logf("failed; stopping what was started")
			if serr := stopAll(s.procs(), s.logf); serr != nil {
				err = errors.Join(err, serr)
			} else {
				_ = os.Remove(filepath.Join(dir, InfoFile))
			}
			s.Release()
		}
	}()
	for attempt := 1; ; attempt++ {
		err := s.bringUp(ctx, opts)
		if err == nil {
			break
		}
		// Ports are picked free but released before the processes
		// bind them; another stack (or any outgoing connection) can
		// take one meanwhile. Start over once on fresh ports.
		if attempt > 1 || !portClash(err) {
			return nil, err
		}
		s.logf("%s; retrying on fresh ports", strings.TrimPrefix(err.Error(), "testnet: "))
		if err := stopAll(s.procs(), s.logf); err != nil {
			return nil, err
		}
		s.reset()
		if err := cleanDir(dir); err != nil {
			return nil, err
		}
	}
	s.Info.Ready = true
	if err := s.writeInfo(); err != nil {
		return nil, fmt.Errorf("testnet: write %s: %w", InfoFile, err)
	}
	s.logf("stack ready in %s (info: %s)", time.Since(s.start).Round(100*time.Millisecond), filepath.Join(dir, InfoFile))
	return s, nil
}

// cleanDir removes what a previous stack left in dir (data, logs,
// testnet.json), leaving the lock file and anything else alone.
func cleanDir(dir string) error {
	// A cluster the postgres user could not keep in dir (under root) is
	// where DIR/postgres/cluster links to.
	if target, err := os.Readlink(filepath.Join(dir, "postgres", "cluster")); err == nil {
		if err := os.RemoveAll(target); err != nil {
			return fmt.Errorf("testnet: clean %s: %w", target, err)
		}
	}
	for _, name := range []string{InfoFile, "btcd", "lnd", "cashu-mint", "logs", "btcd.conf", "postgres", "nwc"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("testnet: clean %s: %w", dir, err)
		}
	}
	return nil
}

// portClash reports whether err is a component failing to bind its port.
func portClash(err error) bool {
	var ce *ComponentError
	if !errors.As(err, &ce) || ce.Log == "" {
		return false
	}
	b, rerr := os.ReadFile(ce.Log)
	return rerr == nil && strings.Contains(string(b), "address already in use")
}

// reset forgets the processes and connections of a failed bring-up
// (already stopped) so bringUp can run again.
func (s *Stack) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns, s.btc = nil, nil
	s.Info = Info{Version: s.Info.Version, Dir: s.Info.Dir}
}

// record writes testnet.json as it stands, so that the processes started
// so far can be found and stopped (by 'down' or the next 'up') even if this
// process dies before Start returns. Failing to write is not fatal here;
// the final write in Start is checked.
func (s *Stack) record() {
	_ = s.writeInfo()
}

// healthy checks that btcd and every lnd answer.
func (s *Stack) healthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := s.btcd()
	if err != nil {
		return err
	}
	if _, err := b.blockCount(ctx); err != nil {
		return err
	}
	for _, n := range s.Info.Nodes {
		c, err := s.Conn(n.Name)
		if err != nil {
			return err
		}
		if _, err := lnrpc.NewLightningClient(c).GetInfo(ctx, &lnrpc.GetInfoRequest{}); err != nil {
			return &ComponentError{Component: "lnd " + n.Name, Log: n.Log, Err: err}
		}
	}
	return nil
}

// freePorts reserves n distinct free TCP ports on 127.0.0.1, below the
// range outgoing connections take theirs from (see internal/freeport),
// for the processes to bind.
func freePorts(n int) ([]int, error) {
	ps, err := freeport.Ports(n)
	if err != nil {
		return nil, fmt.Errorf("testnet: reserve port: %w", err)
	}
	return ps, nil
}

func hostPort(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Stack) bringUp(ctx context.Context, opts Options) error {
	bins, err := EnsureBinaries(ctx, opts.BinDir, s.logf)
	if err != nil {
		return &ComponentError{Component: "build", Err: err}
	}
	if !fileExists(opts.Executable) {
		return &ComponentError{Component: "capvend executable", Err: fmt.Errorf("%s not found", opts.Executable)}
	}
	if err := s.layout(opts); err != nil {
		return err
	}
	// The relay needs nothing else: start it first, check it later.
	if err := s.startRelay(opts.Executable); err != nil {
		return err
	}
	if opts.Postgres {
		if err := s.startPostgres(ctx); err != nil {
			return err
		}
	}
	m, err := s.startChain(ctx, bins)
	if err != nil {
		return err
	}
	addrs, err := s.startLNDs(ctx, bins)
	if err != nil {
		return err
	}
	// The Cashu mint needs only its lnd's RPC; start it now, check later.
	if err := s.startMint(opts.Executable); err != nil {
		return err
	}
	if err := s.fundWallets(ctx, m, addrs); err != nil {
		return err
	}
	if err := s.openChannels(ctx, opts); err != nil {
		return err
	}
	if err := s.waitServices(ctx); err != nil {
		return err
	}
	if opts.NWC {
		return s.startNWC(ctx)
	}
	return nil
}

// layout reserves the stack's ports and fills in s.Info: every address,
// directory and log path, before anything starts.
func (s *Stack) layout(opts Options) error {
	dir := s.Info.Dir
	logs := filepath.Join(dir, "logs")
	reserve := opts.reservePorts
	if reserve == nil {
		reserve = freePorts
	}
	ports, err := reserve(2 + 3*3 + 2 + 1) // the last: PostgreSQL's, if wanted
	if err != nil {
		return err
	}
	next := func() int { p := ports[0]; ports = ports[1:]; return p }

	// btcd
	bd := filepath.Join(dir, "btcd")
	s.Info.Btcd = BtcdInfo{
		RPCHost: hostPort(next()),
		RPCUser: "capvend",
		RPCPass: randomHex(16),
		RPCCert: filepath.Join(bd, "rpc.cert"),
		P2PHost: hostPort(next()),
		DataDir: bd,
		Proc:    Proc{Log: filepath.Join(logs, "btcd.log")},
	}
	for _, name := range []string{Vendor, Customer, MintNode} {
		nd := filepath.Join(dir, "lnd", name)
		mdir := filepath.Join(nd, "data", "chain", "bitcoin", "regtest")
		s.Info.Nodes = append(s.Info.Nodes, NodeInfo{
			Name:             name,
			RPCHost:          hostPort(next()),
			RESTHost:         hostPort(next()),
			P2PHost:          hostPort(next()),
			Dir:              nd,
			TLSCert:          filepath.Join(nd, "tls.cert"),
			AdminMacaroon:    filepath.Join(mdir, "admin.macaroon"),
			InvoiceMacaroon:  filepath.Join(mdir, "invoice.macaroon"),
			ReadonlyMacaroon: filepath.Join(mdir, "readonly.macaroon"),
			Proc:             Proc{Log: filepath.Join(logs, "lnd-"+name+".log")},
		})
	}
	mintPort, relayPort := next(), next()
	s.Info.Mint = ServiceInfo{
		URL: "http://" + hostPort(mintPort), Listen: hostPort(mintPort),
		DataDir: filepath.Join(dir, "cashu-mint"),
		Proc:    Proc{Log: filepath.Join(logs, "cashu-mint.log")},
	}
	s.Info.Relay = ServiceInfo{
		URL: "ws://" + hostPort(relayPort), Listen: hostPort(relayPort),
		MaxMessage: opts.RelayMaxMessage,
		Proc:       Proc{Log: filepath.Join(logs, "relay.log")},
	}
	s.MintURL, s.RelayURL = s.Info.Mint.URL, s.Info.Relay.URL
	if opts.Postgres {
		port := next()
		s.Info.Postgres = &PostgresInfo{Listen: hostPort(port), DataDir: filepath.Join(dir, "postgres"),
			Proc: Proc{Log: filepath.Join(logs, "postgres.log")}}
	}
	s.Info.StartedAt = time.Now().UTC()
	return nil
}

// startChain starts btcd and mines past segwit activation and coinbase
// maturity, to a key of ours (see miner), before any lnd starts.
func (s *Stack) startChain(ctx context.Context, bins Binaries) (*miner, error) {
	dir, bd := s.Info.Dir, s.Info.Btcd.DataDir
	m, err := newMiner()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(bd, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "btcd.conf"), nil, 0o644); err != nil {
		return nil, err
	}
	if err := s.startBtcd(ctx, bins.Btcd, []string{m.addr.EncodeAddress()}); err != nil {
		return nil, err
	}
	s.logf("mining %d blocks", initialBlocks)
	if err := s.generate(ctx, initialBlocks); err != nil {
		return nil, err
	}
	return m, nil
}

// startLNDs starts the three lnd nodes and waits for each, in parallel;
// it records their pubkeys and returns a fresh on-chain address of each.
func (s *Stack) startLNDs(ctx context.Context, bins Binaries) ([]string, error) {
	s.logf("starting lnd %s x3 (vendor, customer, mint)", LNDVersion)
	for i := range s.Info.Nodes {
		n := &s.Info.Nodes[i]
		p, err := spawn(bins.LND, lndArgs(*n, s.Info.Btcd), n.Log, !s.detach)
		if err != nil {
			return nil, &ComponentError{Component: "lnd " + n.Name, Log: n.Log, Err: err}
		}
		n.Proc = p
		s.record()
	}
	g, gctx := errgroup.WithContext(ctx)
	addrs := make([]string, len(s.Info.Nodes))
	pubkeys := make([]string, len(s.Info.Nodes))
	for i := range s.Info.Nodes {
		g.Go(func() error {
			n := s.Info.Nodes[i] // a copy: other goroutines read the slice
			pk, err := s.waitLND(gctx, n)
			if err != nil {
				return err
			}
			pubkeys[i] = pk
			c, _ := s.Conn(n.Name)
			a, err := lnrpc.NewLightningClient(c).NewAddress(gctx, &lnrpc.NewAddressRequest{Type: lnrpc.AddressType_WITNESS_PUBKEY_HASH})
			if err != nil {
				return &ComponentError{Component: "lnd " + n.Name, Log: n.Log, Err: fmt.Errorf("newaddress: %w", err)}
			}
			addrs[i] = a.Address
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i := range s.Info.Nodes {
		s.Info.Nodes[i].Pubkey = pubkeys[i]
	}
	s.logf("lnd nodes up: vendor %.12s…, customer %.12s…, mint %.12s…", s.Info.Nodes[0].Pubkey, s.Info.Nodes[1].Pubkey, s.Info.Nodes[2].Pubkey)
	return addrs, nil
}

// fundWallets pays several UTXOs to each node's address (the customer
// more), so concurrent channel opens and later on-chain actions need no
// unconfirmed change, and confirms them.
func (s *Stack) fundWallets(ctx context.Context, m *miner, addrs []string) error {
	const btc = btcutil.SatoshiPerBitcoin
	var outs []payout
	var custAddr string
	for i, a := range addrs {
		k := 2
		if s.Info.Nodes[i].Name == Customer {
			k, custAddr = 4, a
		}
		for range k {
			outs = append(outs, payout{addr: a, sats: 5 * btc})
		}
	}
	outs = append(outs, payout{addr: custAddr}) // the remainder
	b, err := s.btcd()
	if err != nil {
		return err
	}
	if _, err := m.fund(ctx, b, outs); err != nil {
		return &ComponentError{Component: "btcd", Log: s.Info.Btcd.Log, Err: fmt.Errorf("fund wallets: %w", err)}
	}
	if err := s.Mine(ctx, 1); err != nil {
		return err
	}
	s.logf("funded wallets: customer ~30 BTC, vendor and mint 10 BTC each")
	return nil
}

// waitServices waits until the mint and the relay answer.
func (s *Stack) waitServices(ctx context.Context) error {
	if err := s.waitService(ctx, "cashu mint", s.Info.Mint.Proc, s.Info.Mint.URL+"/v1/info", nil); err != nil {
		return err
	}
	s.logf("cashu mint ready at %s", s.Info.Mint.URL)
	relayHTTP := "http://" + s.Info.Relay.Listen
	if err := s.waitService(ctx, "relay", s.Info.Relay.Proc, relayHTTP, map[string]string{"Accept": "application/nostr+json"}); err != nil {
		return err
	}
	s.logf("relay ready at %s", s.Info.Relay.URL)
	return nil
}

func (s *Stack) startBtcd(ctx context.Context, bin string, miningAddrs []string) error {
	b := &s.Info.Btcd
	b.MiningAddrs = miningAddrs
	args := []string{
		"--regtest",
		"--configfile=" + filepath.Join(s.Info.Dir, "btcd.conf"),
		"--datadir=" + filepath.Join(b.DataDir, "data"),
		"--logdir=" + filepath.Join(b.DataDir, "logs"),
		"--rpccert=" + b.RPCCert,
		"--rpckey=" + filepath.Join(b.DataDir, "rpc.key"),
		"--rpcuser=" + b.RPCUser,
		"--rpcpass=" + b.RPCPass,
		"--rpclisten=" + b.RPCHost,
		"--listen=" + b.P2PHost,
		"--txindex",
		"--rpcmaxclients=200",
		"--rpcmaxwebsockets=200",
		"--debuglevel=info",
	}
	for _, a := range miningAddrs {
		args = append(args, "--miningaddr="+a)
	}
	s.logf("starting btcd %s", BtcdVersion)
	p, err := spawn(bin, args, b.Log, !s.detach)
	if err != nil {
		return &ComponentError{Component: "btcd", Log: b.Log, Err: err}
	}
	b.Proc = p
	s.record()
	s.mu.Lock()
	s.btc = nil // the cert may be new
	s.mu.Unlock()
	err = poll(ctx, readyTimeout, 100*time.Millisecond, "btcd rpc", func() (bool, error) {
		if !p.Alive() {
			return false, errors.New("exited during start")
		}
		if !fileExists(b.RPCCert) {
			return false, nil
		}
		c, err := s.btcd()
		if err != nil {
			s.mu.Lock()
			s.btc = nil
			s.mu.Unlock()
			return false, nil
		}
		_, err = c.blockCount(ctx)
		return err == nil, nil
	})
	if err != nil {
		return &ComponentError{Component: "btcd", Log: b.Log, Err: err}
	}
	return nil
}

func (s *Stack) generate(ctx context.Context, n int) error {
	c, err := s.btcd()
	if err != nil {
		return err
	}
	if _, err := c.generate(ctx, n); err != nil {
		return &ComponentError{Component: "btcd", Log: s.Info.Btcd.Log, Err: err}
	}
	return nil
}

// waitLND waits until the node's macaroons exist and its server is fully
// active, and returns its identity pubkey.
func (s *Stack) waitLND(ctx context.Context, n NodeInfo) (string, error) {
	var pubkey string
	err := poll(ctx, readyTimeout, 200*time.Millisecond, "lnd rpc", func() (bool, error) {
		if !n.Alive() {
			return false, errors.New("exited during start")
		}
		if !fileExists(n.AdminMacaroon) || !fileExists(n.TLSCert) {
			return false, nil
		}
		c, err := s.Conn(n.Name)
		if err != nil {
			return false, nil
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// GetInfo answers before the p2p server runs; SERVER_ACTIVE
		// means every RPC (ConnectPeer, OpenChannel ...) works.
		st, err := lnrpc.NewStateClient(c).GetState(cctx, &lnrpc.GetStateRequest{})
		if err != nil || st.State != lnrpc.WalletState_SERVER_ACTIVE {
			return false, nil
		}
		gi, err := lnrpc.NewLightningClient(c).GetInfo(cctx, &lnrpc.GetInfoRequest{})
		if err != nil {
			return false, nil
		}
		pubkey = gi.IdentityPubkey
		return true, nil
	})
	if err != nil {
		return "", &ComponentError{Component: "lnd " + n.Name, Log: n.Log, Err: err}
	}
	// lnd writes invoice.macaroon and readonly.macaroon world-readable
	// (0644) and admin.macaroon group-readable (0640); capvend refuses
	// secrets others can read, so the stack keeps them owner-only.
	for _, mac := range []string{n.AdminMacaroon, n.InvoiceMacaroon, n.ReadonlyMacaroon} {
		if err := os.Chmod(mac, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", &ComponentError{Component: "lnd " + n.Name, Log: n.Log, Err: err}
		}
	}
	return pubkey, nil
}

// waitSynced waits until every lnd reports height >= h and synced to chain.
func (s *Stack) waitSynced(ctx context.Context, h int64) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, n := range s.Info.Nodes {
		g.Go(func() error {
			c, err := s.Conn(n.Name)
			if err != nil {
				return err
			}
			lc := lnrpc.NewLightningClient(c)
			err = poll(gctx, readyTimeout, 200*time.Millisecond, fmt.Sprintf("sync to height %d", h), func() (bool, error) {
				if !n.Alive() {
					return false, errors.New("exited")
				}
				gi, err := lc.GetInfo(gctx, &lnrpc.GetInfoRequest{})
				if err != nil {
					return false, nil
				}
				return gi.SyncedToChain && int64(gi.BlockHeight) >= h, nil
			})
			if err != nil {
				return &ComponentError{Component: "lnd " + n.Name, Log: n.Log, Err: err}
			}
			return nil
		})
	}
	return g.Wait()
}

func (s *Stack) startMint(exe string) error {
	m := &s.Info.Mint
	n, _ := s.Node(MintNode)
	args := []string{"testnet", "mint",
		"--listen", m.Listen,
		"--lnd-host", n.RPCHost,
		"--lnd-cert", n.TLSCert,
		"--lnd-macaroon", n.AdminMacaroon,
		"--db", m.DataDir,
	}
	p, err := spawn(exe, args, m.Log, !s.detach)
	if err != nil {
		return &ComponentError{Component: "cashu mint", Log: m.Log, Err: err}
	}
	m.Proc = p
	s.record()
	return nil
}

func (s *Stack) startRelay(exe string) error {
	r := &s.Info.Relay
	args := []string{"testnet", "relay", "--listen", r.Listen}
	if r.MaxMessage > 0 {
		args = append(args, "--max-message-length", strconv.Itoa(r.MaxMessage))
	}
	p, err := spawn(exe, args, r.Log, !s.detach)
	if err != nil {
		return &ComponentError{Component: "relay", Log: r.Log, Err: err}
	}
	r.Proc = p
	s.record()
	return nil
}

// waitService polls url until it answers 200.
func (s *Stack) waitService(ctx context.Context, name string, p Proc, url string, hdr map[string]string) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	err := poll(ctx, readyTimeout, 100*time.Millisecond, name, func() (bool, error) {
		if !p.Alive() {
			return false, errors.New("exited during start")
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return &ComponentError{Component: name, Log: p.Log, Err: err}
	}
	return nil
}
