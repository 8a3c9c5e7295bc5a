package testnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"time"
	"unsafe"

	"github.com/elnosh/gonuts/mint"
	"github.com/elnosh/gonuts/mint/lightning"
	"google.golang.org/grpc/credentials"

	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/internal/khatrurelay"
)

// MintConfig configures RunMint.
type MintConfig struct {
	// Listen is the address to serve on; it must be a loopback address
	// such as 127.0.0.1:3338.
	Listen string
	// LNDHost, LNDCert and LNDMacaroon reach the LND node backing the
	// mint. The macaroon must allow reading the wallet balance (admin
	// does; invoice does not): gonuts checks it at start.
	LNDHost, LNDCert, LNDMacaroon string
	// DBDir holds the mint's SQLite database and keys.
	DBDir string
	// Log receives the wrapper's own lines (gonuts logs to stdout and
	// DBDir/mint.log);
	// nil means slog.Default().
	Log *slog.Logger
}

// RunMint runs a gonuts v0.4.2 Cashu mint backed by LND until ctx ends,
// then shuts it down. It serves the mint's HTTP API on cfg.Listen only:
// gonuts' own Start would listen on all interfaces, so RunMint serves the
// mint's handler on its own listener instead. Its NUT-17 websocket
// (/v1/ws) is served behind a guard that keeps a subscriber's dropped
// connection from crashing gonuts (see mintws.go).
func RunMint(ctx context.Context, cfg MintConfig) error {
	if err := requireLoopback(cfg.Listen); err != nil {
		return err
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	tlsCreds, err := credentials.NewClientTLSFromFile(cfg.LNDCert, "")
	if err != nil {
		return fmt.Errorf("testnet mint: lnd cert: %w", err)
	}
	mac, err := lnd.Macaroon(cfg.LNDMacaroon)
	if err != nil {
		return err
	}
	lnd, err := lightning.SetupLndClient(lightning.LndConfig{GRPCHost: cfg.LNDHost, Cert: tlsCreds, Macaroon: mac})
	if err != nil {
		return fmt.Errorf("testnet mint: lnd client: %w", err)
	}
	ms, err := mint.SetupMintServer(mint.Config{
		MintPath:        cfg.DBDir,
		LightningClient: lnd,
		MintInfo: mint.MintInfo{
			Name:        "capvend testnet mint",
			Description: "regtest Cashu mint of the capvend testnet stack",
		},
		LogLevel: mint.Info,
	})
	if err != nil {
		return fmt.Errorf("testnet mint: %w", err)
	}
	h, err := mintHandler(ms)
	if err != nil {
		ms.Shutdown()
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		ms.Shutdown()
		return fmt.Errorf("testnet mint: %w", err)
	}
	// gonuts' NUT-17 endpoint crashes the mint when a subscriber drops
	// at the wrong moment: it is served behind a guard (mintws.go).
	h, stopGuard, err := guardWS(ctx, h, log)
	if err != nil {
		ln.Close()
		ms.Shutdown()
		return fmt.Errorf("testnet mint: %w", err)
	}
	log.Info("cashu mint listening", "addr", ln.Addr().String(), "lnd", cfg.LNDHost)
	err = serve(ctx, ln, h)
	stopGuard()
	ms.Shutdown()
	return err
}

// mintHandler returns the HTTP handler gonuts' MintServer built for itself.
// gonuts v0.4.2 exposes no handler and its Start binds ":port" (every
// interface), so the handler is read from the unexported httpServer field.
// The version is pinned in go.mod; a mismatch fails loudly here.
func mintHandler(ms *mint.MintServer) (http.Handler, error) {
	v := reflect.ValueOf(ms).Elem().FieldByName("httpServer")
	if !v.IsValid() || v.Type() != reflect.TypeFor[*http.Server]() {
		return nil, errors.New("testnet mint: gonuts MintServer has no httpServer field (gonuts version changed?)")
	}
	srv := *(**http.Server)(unsafe.Pointer(v.UnsafeAddr()))
	if srv == nil || srv.Handler == nil {
		return nil, errors.New("testnet mint: gonuts MintServer has no handler")
	}
	return srv.Handler, nil
}

// RunRelay runs an in-memory khatru Nostr relay on listen (a loopback
// address) until ctx ends. Events live in memory only; ephemeral kinds are
// broadcast and not stored. maxMessage, when positive, is the largest
// websocket message it reads (a client sending a larger one has its
// connection closed, as public relays do), advertised in NIP-11 as
// limitation.max_message_length; 0 leaves khatru's own limit (512,000
// bytes), not advertised.
func RunRelay(ctx context.Context, listen string, maxMessage int, log *slog.Logger) error {
	if err := requireLoopback(listen); err != nil {
		return err
	}
	if maxMessage < 0 {
		return fmt.Errorf("testnet relay: negative message limit %d", maxMessage)
	}
	if log == nil {
		log = slog.Default()
	}
	rl := khatrurelay.New(khatrurelay.Options{Name: "capvend testnet relay", Description: "in-memory relay of the capvend testnet stack",
		MaxMessageLength: maxMessage})
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("testnet relay: %w", err)
	}
	log.Info("nostr relay listening", "addr", "ws://"+ln.Addr().String(), "max_message_length", maxMessage)
	return serve(ctx, ln, rl)
}

// serve serves h on ln until ctx ends, then shuts down (5 s grace).
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func requireLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("testnet: listen address %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("testnet: listen address %q is not a loopback IP", addr)
	}
	return nil
}
