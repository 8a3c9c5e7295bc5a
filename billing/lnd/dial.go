package lnd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/lightningnetwork/lnd/macaroons"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"gopkg.in/macaroon.v2"
)

// Dial returns a gRPC connection to the LND node at host (host:port),
// authenticated by LND's TLS certificate and a macaroon, both read from
// files. Like grpc.NewClient it connects on first use; errors here are about
// the credential files, and name the file (never its contents). The caller
// closes the connection.
func Dial(host, tlsCertFile, macaroonFile string) (*grpc.ClientConn, error) {
	tlsCreds, err := credentials.NewClientTLSFromFile(tlsCertFile, "")
	if err != nil {
		return nil, fmt.Errorf("lnd: TLS certificate %s: %w", tlsCertFile, fileError(err))
	}
	cred, err := Macaroon(macaroonFile)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(host,
		grpc.WithTransportCredentials(tlsCreds),
		grpc.WithPerRPCCredentials(cred),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(50<<20)),
	)
	if err != nil {
		return nil, fmt.Errorf("lnd: dial %s: %w", host, err)
	}
	return conn, nil
}

// Macaroon reads a binary macaroon file as per-RPC credentials.
func Macaroon(file string) (macaroons.MacaroonCredential, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return macaroons.MacaroonCredential{}, fmt.Errorf("lnd: macaroon %s: %w", file, fileError(err))
	}
	var mac macaroon.Macaroon
	if err := mac.UnmarshalBinary(raw); err != nil {
		return macaroons.MacaroonCredential{}, fmt.Errorf("lnd: macaroon %s is not a binary macaroon (use the .macaroon file LND wrote, not its hex)", file)
	}
	cred, err := macaroons.NewMacaroonCredential(&mac)
	if err != nil {
		return macaroons.MacaroonCredential{}, fmt.Errorf("lnd: macaroon %s: %w", file, err)
	}
	return cred, nil
}

func fileError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("no such file")
	case errors.Is(err, fs.ErrPermission):
		return errors.New("permission denied reading it")
	}
	return err
}
