// Package admin is capvend's operator listener (admin.listen): Prometheus
// metrics at /metrics, liveness at /healthz, readiness at /readyz, the
// operator's dashboard (Dashboard, at /), and whatever else cmd registers
// with Handle. It is a listener of its own, never the MCP
// endpoint's: clients of the MCP front cannot reach it.
//
// It listens on loopback unless given a bearer token; with a token every
// request must carry it (Authorization: Bearer TOKEN).
package admin

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ErrNeedsToken: the listen address is not loopback and no token was given.
var ErrNeedsToken = errors.New("an admin listener off loopback needs a bearer token (admin.token_file)")

// Check is one condition of readiness: nil when it holds, else why not
// (the reason is shown on /readyz: it must hold no secret). Info, if set,
// is what /readyz shows of it when it holds (a setting in force; no
// secret either).
type Check struct {
	Name  string
	Check func(ctx context.Context) error
	Info  func() string
}

// Server is the admin listener's HTTP handler. Register routes and checks
// before serving.
type Server struct {
	token []byte
	log   *slog.Logger
	mux   *http.ServeMux

	mu     sync.Mutex
	checks []Check
}

// NewServer returns the admin handler for a listener on addr (host:port):
// without a token, addr must be a loopback address (127.0.0.0/8, ::1,
// localhost), else ErrNeedsToken. /healthz and /readyz are routed.
func NewServer(addr string, token []byte, log *slog.Logger) (*Server, error) {
	if len(token) == 0 && !Loopback(addr) {
		return nil, fmt.Errorf("admin.listen %s: %w", addr, ErrNeedsToken)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{token: token, log: log, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)
	return s, nil
}

// Loopback reports whether a host:port listens on loopback only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Handle routes pattern (http.ServeMux syntax) to h, behind the token
// check. It panics if pattern is routed already, like http.ServeMux.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// AddCheck adds a readiness check: /readyz is 200 only when every check
// passes.
func (s *Server) AddCheck(c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append(s.checks, c)
}

// ServeHTTP implements http.Handler: the token check, then the routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="capvend admin"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) authorized(r *http.Request) bool {
	if len(s.token) == 0 {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), s.token) == 1
}

// runChecks runs every readiness check (each bounded by ctx and 5 s).
func (s *Server) runChecks(ctx context.Context) []CheckResult {
	s.mu.Lock()
	checks := append([]Check(nil), s.checks...)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := make([]CheckResult, 0, len(checks))
	for _, c := range checks {
		r := CheckResult{Name: c.Name, OK: true}
		if err := c.Check(ctx); err != nil {
			r.OK, r.Why = false, err.Error()
		} else if c.Info != nil {
			r.Why = c.Info()
		}
		out = append(out, r)
	}
	return out
}

// readyz runs every check and answers 200 with "ok" lines (with a
// check's Info), or 503 with the failing checks' reasons.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	ready := true
	for _, c := range s.runChecks(r.Context()) {
		if !c.OK {
			ready = false
			fmt.Fprintf(&b, "not ready: %s: %s\n", c.Name, c.Why)
		} else if c.Why != "" {
			fmt.Fprintf(&b, "ok: %s: %s\n", c.Name, c.Why)
		} else {
			fmt.Fprintf(&b, "ok: %s\n", c.Name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprint(w, b.String())
}

// Serve serves s on ln until ctx ends, then shuts down (in-flight
// requests get up to 5 s). It returns nil after ctx ends, else the
// listener's error.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	srv.Shutdown(shutdown)
	<-errc
	return nil
}
