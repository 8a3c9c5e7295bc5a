package testnet

import (
	"fmt"
	"os"

	"github.com/lightningnetwork/lnd/macaroons"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"gopkg.in/macaroon.v2"
)

// DialLND returns a gRPC client connection to an lnd node at host
// (host:port), authenticated by the TLS certificate at certPath and the
// macaroon at macaroonPath. Like grpc.NewClient it does not connect until
// the first call; errors are about reading the credentials. The caller
// closes the connection.
func DialLND(host, certPath, macaroonPath string) (*grpc.ClientConn, error) {
	tlsCreds, err := credentials.NewClientTLSFromFile(certPath, "")
	if err != nil {
		return nil, fmt.Errorf("testnet: lnd tls cert %s: %w", certPath, err)
	}
	macCred, err := loadMacaroon(macaroonPath)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(host,
		grpc.WithTransportCredentials(tlsCreds),
		grpc.WithPerRPCCredentials(macCred),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(50<<20)),
	)
	if err != nil {
		return nil, fmt.Errorf("testnet: dial lnd %s: %w", host, err)
	}
	return conn, nil
}

func loadMacaroon(path string) (macaroons.MacaroonCredential, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return macaroons.MacaroonCredential{}, fmt.Errorf("testnet: read macaroon: %w", err)
	}
	var mac macaroon.Macaroon
	if err := mac.UnmarshalBinary(b); err != nil {
		return macaroons.MacaroonCredential{}, fmt.Errorf("testnet: parse macaroon %s: %w", path, err)
	}
	cred, err := macaroons.NewMacaroonCredential(&mac)
	if err != nil {
		return macaroons.MacaroonCredential{}, fmt.Errorf("testnet: macaroon credential: %w", err)
	}
	return cred, nil
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
