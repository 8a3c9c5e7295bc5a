package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/capvend/capvend/adapters/admin"
)

// newAdmin makes the admin listener's handler and the metrics of cfg
// (admin.listen set): the bearer token read from admin.token_file, the
// configured upstreams and priced items as the only label values.
func newAdmin(cfg *Config, log *slog.Logger) (*admin.Server, *admin.Metrics, error) {
	var token []byte
	if cfg.Admin.TokenFile != "" {
		var err error
		if token, err = readTokenFile("admin.token_file", cfg.Admin.TokenFile); err != nil {
			return nil, nil, err
		}
	}
	srv, err := admin.NewServer(cfg.Admin.Listen, token, log)
	if err != nil {
		return nil, nil, err
	}
	servers, items := metricLabels(cfg)
	m := admin.NewMetrics(servers, items, admin.Sources{}, log)
	srv.Handle("GET /metrics", m.Handler())
	if cfg.Admin.Pprof {
		srv.Handle("GET /debug/pprof/", http.HandlerFunc(pprof.Index))
		srv.Handle("GET /debug/pprof/cmdline", http.HandlerFunc(pprof.Cmdline))
		srv.Handle("GET /debug/pprof/profile", http.HandlerFunc(pprof.Profile))
		srv.Handle("GET /debug/pprof/symbol", http.HandlerFunc(pprof.Symbol))
		srv.Handle("GET /debug/pprof/trace", http.HandlerFunc(pprof.Trace))
	}
	return srv, m, nil
}

// metricLabels are the label values the configuration allows: its
// upstreams' names, and the items it prices under each.
func metricLabels(cfg *Config) ([]string, []admin.Item) {
	var servers []string
	var items []admin.Item
	for _, u := range cfg.Upstreams {
		servers = append(servers, u.Name)
		for _, m := range []map[string]ToolConfig{u.Tools, u.Prompts, u.Resources} {
			for name := range m {
				items = append(items, admin.Item{Server: u.Name, Tool: name})
			}
		}
	}
	return servers, items
}

// connected is a payment backend that can tell whether it is connected
// (LND: its invoice stream is open).
type connected interface{ Connected() bool }

// watch gives the metrics their gauges, the admin listener its readiness
// checks and the dashboard its books, once every part is made.
func (s *vendServer) watch() error {
	s.metrics.SetSources(admin.Sources{
		Open: func(ctx context.Context) (admin.Open, error) {
			o, err := s.l.OpenCounts(ctx)
			return admin.Open{Quotes: o.OpenQuotes, LockedHolds: o.LockedHolds, RefundsOwed: o.RefundsOwed, OwedMsat: o.OwedMsat}, err
		},
		InFlight:  s.v.InFlight,
		Sessions:  s.sessions,
		Relays:    s.relays,
		Upstreams: func() int { return len(s.ups.Status()) - len(s.upstreamsDown()) },
		Nostr:     s.nostrPublish,
	})
	s.admin.AddCheck(admin.Check{Name: "ledger", Check: func(ctx context.Context) error {
		_, err := s.l.OpenCounts(ctx)
		return err
	}})
	s.admin.AddCheck(admin.Check{Name: "payments", Check: s.paymentsReady})
	// What unpriced items are; not ready while a price names nothing its
	// upstream lists (see priceCheck).
	s.admin.AddCheck(admin.Check{Name: "prices", Check: s.prices.ready, Info: s.prices.info})
	s.admin.AddCheck(admin.Check{Name: "upstreams", Check: func(context.Context) error {
		if down := s.upstreamsDown(); len(down) > 0 {
			return fmt.Errorf("not listed yet: %s", strings.Join(down, ", "))
		}
		return nil
	}})
	if s.nostr != nil {
		s.admin.AddCheck(admin.Check{Name: "nostr", Check: s.nostrReady, Info: s.nostrRefusing})
	}
	_, err := admin.NewDashboard(s.admin, s.metrics, ledgerDashboard{s.l})
	return err
}

// sessions are the live sessions of each front.
func (s *vendServer) sessions() map[string]int {
	m := map[string]int{"http": s.front.Sessions()}
	if s.nostr != nil {
		m["nostr"] = s.nostr.Sessions()
	}
	return m
}

func (s *vendServer) relays() int {
	if s.nostr == nil {
		return 0
	}
	return s.nostr.RelaysConnected()
}

// nostrPublish is the Nostr front's publication counts for the metrics
// (nil without the front: no series).
func (s *vendServer) nostrPublish() admin.NostrPublish {
	if s.nostr == nil {
		return admin.NostrPublish{}
	}
	st := s.nostr.PublishStats()
	out := admin.NostrPublish{Undelivered: st.Undelivered, Transfers: map[[2]string]uint64{
		{"out", "ok"}: st.TransfersOut, {"out", "failed"}: st.TransfersOutFailed,
		{"in", "ok"}: st.TransfersIn, {"in", "failed"}: st.TransfersInFailed}}
	for _, r := range st.Relays {
		out.Relays = append(out.Relays, admin.RelayPublish{URL: r.URL, Accepted: r.Accepted, Failed: r.Failed})
	}
	return out
}

// refusingRelays describes the relays whose last answer to one of our
// events was a refusal, with its reason.
func (s *vendServer) refusingRelays() (refusing []string, all bool) {
	st := s.nostr.PublishStats()
	for _, r := range st.Relays {
		if r.Refusing {
			refusing = append(refusing, fmt.Sprintf("%s refuses our events (%q, %s ago)", r.URL, r.LastRefusal,
				time.Since(r.LastRefusalAt).Round(time.Second)))
		}
	}
	return refusing, len(st.Relays) > 0 && len(refusing) == len(st.Relays)
}

// nostrRefusing is the nostr check's Info: the relays that refuse our
// events, when some do.
func (s *vendServer) nostrRefusing() string {
	r, _ := s.refusingRelays()
	return strings.Join(r, "; ")
}

// nostrReady: the Nostr front is subscribed on a relay (its end of
// stored events came, and the subscription has not ended since), and
// not every relay refuses our events.
func (s *vendServer) nostrReady(context.Context) error {
	if r, all := s.refusingRelays(); all {
		return fmt.Errorf("every relay refuses our events: %s", strings.Join(r, "; "))
	}
	var down []string
	for _, st := range s.nostr.RelayStates() {
		if st.Subscribed {
			return nil
		}
		msg := st.URL + ": not subscribed yet"
		if st.Err != "" {
			msg = st.URL + ": " + st.Err
		}
		down = append(down, msg)
	}
	return fmt.Errorf("no relay subscribed: %s", strings.Join(down, "; "))
}

// upstreamsDown names the upstreams that have not listed their tools (or
// are down now).
func (s *vendServer) upstreamsDown() []string {
	var down []string
	for _, st := range s.ups.Status() {
		if !st.Listed {
			down = append(down, st.Server)
		}
	}
	return down
}

// paymentsReady: a payment backend is connected (with none configured,
// capvend sells free tools only, and is ready without).
func (s *vendServer) paymentsReady(context.Context) error {
	if len(s.backends) == 0 {
		return nil
	}
	for _, b := range s.backends {
		if c, ok := b.(connected); !ok || c.Connected() {
			return nil
		}
	}
	return errors.New("no payment backend connected yet")
}

// bindAdmin binds the admin listener, if configured (nil if not): at
// start, so that a failure to bind fails serve before anything runs.
func (s *vendServer) bindAdmin() (net.Listener, error) {
	if s.admin == nil {
		return nil, nil
	}
	ln, err := net.Listen("tcp", s.cfg.Admin.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin.listen %s: %w", s.cfg.Admin.Listen, err)
	}
	fmt.Fprintf(s.e.Stderr, "capvend: admin listener at http://%s (dashboard /, /metrics, /healthz, /readyz)\n", ln.Addr())
	return ln, nil
}

// runAdmin serves the admin listener ln (if not nil) in g until ctx ends.
func (s *vendServer) runAdmin(g *errgroup.Group, ctx context.Context, ln net.Listener) {
	if ln != nil {
		g.Go(func() error { return s.admin.Serve(ctx, ln) })
	}
}
