package testnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// NWCInfo describes the stack's NWC wallet service (Options.NWC): Alby's
// NWCWalletService (@getalby/sdk) in front of one LND node, with hold
// invoices and notifications added (testnet/nwc/service.mjs).
type NWCInfo struct {
	Node  string `json:"node"`  // the LND node it fronts (Vendor)
	Relay string `json:"relay"` // the relay it listens on
	// URIs are its connections' nostr+walletconnect:// URIs by name:
	// "hold" (every method, hold invoices included), "plain" (no
	// hold-invoice methods), "nip04" (an info event offering NIP-04
	// only) and "receive" (what capvend asks for: no pay_invoice, no
	// get_balance). Each holds its secret (regtest only).
	URIs map[string]string `json:"uris"`
	Proc
}

// The connections of the NWC wallet service.
const (
	NWCHold  = "hold"
	NWCPlain = "plain"
	NWCNIP04 = "nip04"
	// NWCReceive grants what capvend's doctor asks for: receiving only.
	NWCReceive = "receive"
)

// NWCOptions configure StartNWC.
type NWCOptions struct {
	Node  NodeInfo // the LND node the wallet fronts (its admin macaroon is used)
	Relay string   // ws:// URL of the relay it listens on
	Dir   string   // where its log and connections file go
	// ServiceDir is testnet/nwc with its node_modules (default
	// NWCServiceDir()).
	ServiceDir string
	// Detach leaves the process running when the caller exits.
	Detach bool
}

// ErrNWCNotInstalled: the wallet service's npm packages are not installed
// (cd testnet/nwc && npm ci), or node is missing.
var ErrNWCNotInstalled = errors.New("testnet: the NWC wallet service is not installed (needs node, and: cd testnet/nwc && npm ci)")

// NWCInstall is the command that installs the wallet service's packages.
const NWCInstall = "cd testnet/nwc && npm ci"

// NWCServiceDir finds testnet/nwc: $CAPVEND_NWC_DIR, else testnet/nwc in
// the capvend module that holds the working directory. It returns
// ErrNWCNotInstalled when node or the npm packages are missing.
func NWCServiceDir() (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", fmt.Errorf("%w: node: %v", ErrNWCNotInstalled, err)
	}
	dir := os.Getenv("CAPVEND_NWC_DIR")
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		for d := wd; ; d = filepath.Dir(d) {
			if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/capvend/capvend\n") {
				dir = filepath.Join(d, "testnet", "nwc")
				break
			}
			if filepath.Dir(d) == d {
				return "", fmt.Errorf("%w: no capvend checkout above %s (or set CAPVEND_NWC_DIR)", ErrNWCNotInstalled, wd)
			}
		}
	}
	if !fileExists(filepath.Join(dir, "service.mjs")) || !fileExists(filepath.Join(dir, "node_modules", "@getalby", "sdk", "package.json")) {
		return "", fmt.Errorf("%w: %s", ErrNWCNotInstalled, dir)
	}
	return dir, nil
}

// StartNWC starts the NWC wallet service and waits until its connections
// are published (at most 60 s). The caller owns stopping its process
// (Proc.stop; a Stack started with Options.NWC stops it with the rest).
func StartNWC(ctx context.Context, o NWCOptions) (*NWCInfo, error) {
	sdir := o.ServiceDir
	if sdir == "" {
		var err error
		if sdir, err = NWCServiceDir(); err != nil {
			return nil, err
		}
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNWCNotInstalled, err)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	out := filepath.Join(o.Dir, "connections.json")
	_ = os.Remove(out)
	info := &NWCInfo{Node: o.Node.Name, Relay: o.Relay}
	// env sets LND's certificate for node's fetch, then becomes node.
	args := []string{"NODE_EXTRA_CA_CERTS=" + o.Node.TLSCert, node, filepath.Join(sdir, "service.mjs"),
		"--relay", o.Relay, "--lnd-rest", o.Node.RESTHost, "--macaroon", o.Node.AdminMacaroon, "--out", out}
	info.Proc, err = spawn("/usr/bin/env", args, filepath.Join(o.Dir, "nwc-wallet.log"), !o.Detach)
	if err != nil {
		return nil, &ComponentError{Component: "nwc wallet", Err: err}
	}
	err = poll(ctx, time.Minute, 100*time.Millisecond, "nwc wallet connections", func() (bool, error) {
		if !info.Alive() {
			return false, errors.New("exited during start")
		}
		b, err := os.ReadFile(out)
		if err != nil {
			return false, nil
		}
		return json.Unmarshal(b, &info.URIs) == nil && info.URIs[NWCHold] != "", nil
	})
	if err != nil {
		_ = info.stop(10 * time.Second)
		return nil, &ComponentError{Component: "nwc wallet", Log: info.Log, Err: err}
	}
	return info, nil
}

// Stop stops the wallet service's process.
func (n *NWCInfo) Stop() error { return n.stop(10 * time.Second) }

// startNWC starts the stack's wallet service in front of the vendor node.
func (s *Stack) startNWC(ctx context.Context) error {
	n, err := s.mustNode(Vendor)
	if err != nil {
		return err
	}
	info, err := StartNWC(ctx, NWCOptions{Node: n, Relay: s.Info.Relay.URL, Dir: filepath.Join(s.Info.Dir, "nwc"), Detach: s.detach})
	if err != nil {
		return err
	}
	s.Info.NWC = info
	s.record()
	s.logf("nwc wallet service ready in front of lnd %s (connections: hold, plain, nip04, receive)", Vendor)
	return nil
}
