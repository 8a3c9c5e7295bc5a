package testnet

import (
	"google.golang.org/grpc"

	"github.com/capvend/capvend/billing/lnd"
)

// DialLND returns a gRPC client connection to an lnd node at host
// (host:port), authenticated by the TLS certificate at certPath and the
// macaroon at macaroonPath: the same dialing capvend's LND backend uses.
// Like grpc.NewClient it does not connect until the first call. The caller
// closes the connection.
func DialLND(host, certPath, macaroonPath string) (*grpc.ClientConn, error) {
	return lnd.Dial(host, certPath, macaroonPath)
}

// lndArgs is the command line of one lnd node of the stack.
func lndArgs(n NodeInfo, b BtcdInfo) []string {
	return []string{
		"--lnddir=" + n.Dir,
		"--noseedbackup",
		"--bitcoin.regtest",
		"--bitcoin.node=btcd",
		"--btcd.rpchost=" + b.RPCHost,
		"--btcd.rpcuser=" + b.RPCUser,
		"--btcd.rpcpass=" + b.RPCPass,
		"--btcd.rpccert=" + b.RPCCert,
		"--rpclisten=" + n.RPCHost,
		"--restlisten=" + n.RESTHost,
		"--listen=" + n.P2PHost,
		"--alias=" + n.Name,
		"--trickledelay=50",
		"--maxpendingchannels=10",
		"--accept-keysend",
		"--accept-amp",
		"--debuglevel=info",
		"--nobootstrap",
		// The stack restarts btcd once during bring-up; keep lnd from
		// treating that as a dead backend.
		"--healthcheck.chainbackend.attempts=0",
	}
}
