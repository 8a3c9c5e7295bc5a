package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/vend"
)

// NWCConfig is the Nostr Wallet Connect backend: the seller's wallet,
// reached by NIP-47. URIFile names the connection "nwc"; Wallets names
// more, one per wallet.
type NWCConfig struct {
	// URIFile names the file holding the nostr+walletconnect:// URI (a
	// secret: it spends what the connection was granted). Empty, with no
	// Wallets, disables the backend.
	URIFile string `yaml:"uri_file"`
	// HoldInvoices uses hold invoices where the connection may
	// (make/settle/cancel_hold_invoice); default on.
	HoldInvoices bool `yaml:"hold_invoices"`
	// Grace is how long a plain wallet invoice stays payable past its
	// expiry (NIP-47 cannot withdraw it; late money is owed back).
	Grace time.Duration `yaml:"grace"`
	// Timeout bounds one request to the wallet.
	Timeout time.Duration `yaml:"timeout"`
	// Wallets are further connections, each its own backend
	// "nwc:<name>".
	Wallets []NWCWalletConfig `yaml:"wallets"`
}

// NWCWalletConfig is one more NWC connection.
type NWCWalletConfig struct {
	Name string `yaml:"name"` // lower-case letters, digits, '_' and '-'
	// URIFile names the file holding its nostr+walletconnect:// URI (a
	// secret).
	URIFile      string `yaml:"uri_file"`
	HoldInvoices *bool  `yaml:"hold_invoices"` // default: nwc.hold_invoices
}

// nwcConn is one configured connection.
type nwcConn struct {
	name    string // "" for nwc.uri_file
	field   string // its uri_file's config field
	uriFile string
	hold    bool
}

func (c nwcConn) backend() vend.Backend { return vend.NWCBackend(c.name) }

// connections lists the configured NWC connections.
func (c *NWCConfig) connections() []nwcConn {
	var out []nwcConn
	if c.URIFile != "" {
		out = append(out, nwcConn{field: "nwc.uri_file", uriFile: c.URIFile, hold: c.HoldInvoices})
	}
	for i, w := range c.Wallets {
		hold := c.HoldInvoices
		if w.HoldInvoices != nil {
			hold = *w.HoldInvoices
		}
		out = append(out, nwcConn{name: w.Name, field: fmt.Sprintf("nwc.wallets[%d].uri_file", i), uriFile: w.URIFile, hold: hold})
	}
	return out
}

// validateNWC checks the nwc section and payments.prefer.
func (c *Config) validateNWC(p *problems) {
	seen := map[string]bool{}
	for i, w := range c.NWC.Wallets {
		switch {
		case !vend.ValidNWCName(w.Name) || w.Name == "nwc":
			p.bad(fmt.Sprintf("nwc.wallets[%d].name", i), "%q must be lower-case letters, digits, '_' and '-' (and not \"nwc\")", w.Name)
		case seen[w.Name]:
			p.bad(fmt.Sprintf("nwc.wallets[%d].name", i), "%q is used twice", w.Name)
		}
		seen[w.Name] = true
		if w.URIFile == "" {
			p.bad(fmt.Sprintf("nwc.wallets[%d].uri_file", i), "required: the path of a file holding the wallet's nostr+walletconnect:// URI")
		}
	}
	for _, conn := range c.NWC.connections() {
		if strings.Contains(conn.uriFile, "walletconnect") || strings.Contains(conn.uriFile, "secret=") {
			p.bad(conn.field, "must be the path of a file holding the URI, not the URI itself")
		}
	}
	if len(c.NWC.connections()) > 0 {
		if c.NWC.Grace < time.Second || c.NWC.Grace > time.Hour {
			p.bad("nwc.grace", "%s is outside 1s .. 1h", c.NWC.Grace)
		}
		if c.NWC.Timeout < time.Second || c.NWC.Timeout > 5*time.Minute {
			p.bad("nwc.timeout", "%s is outside 1s .. 5m", c.NWC.Timeout)
		}
	}
	have := c.backendNames()
	for i, name := range c.Payments.Prefer {
		if !slices.Contains(have, vend.Backend(name)) {
			p.bad(fmt.Sprintf("payments.prefer[%d]", i), "%q is not a configured backend (configured: %s)", name, joinBackends(have))
		}
	}
}

// backendNames lists the configured payment backends in their default
// order: lnd, the NWC connections, cashu.
func (c *Config) backendNames() []vend.Backend {
	var out []vend.Backend
	if c.LND.Host != "" {
		out = append(out, vend.BackendLND)
	}
	for _, conn := range c.NWC.connections() {
		out = append(out, conn.backend())
	}
	if len(c.Cashu.Mints) > 0 {
		out = append(out, vend.BackendCashu)
	}
	return out
}

func joinBackends(bs []vend.Backend) string {
	if len(bs) == 0 {
		return "none"
	}
	s := make([]string, len(bs))
	for i, b := range bs {
		s[i] = string(b)
	}
	return strings.Join(s, ", ")
}

// preferred orders backends by payments.prefer: those it names first, in
// its order, then the others in their default order. vend asks the first
// available one for a call's invoice (unless the client names another
// with _meta "capvend/invoice_from"), passing over an NWC wallet out of
// reach.
func preferred(bs []vend.PaymentBackend, prefer []string) []vend.PaymentBackend {
	out := make([]vend.PaymentBackend, 0, len(bs))
	for _, name := range prefer {
		for _, b := range bs {
			if string(b.Name()) == name && !slices.Contains(out, b) {
				out = append(out, b)
			}
		}
	}
	for _, b := range bs {
		if !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out
}

// readNWCURI reads and parses the URI in a connection's file. Errors name
// the file, never its content.
func readNWCURI(field, path string) (nwc.URI, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nwc.URI{}, fmt.Errorf("%s: %w", field, err)
	}
	u, err := nwc.ParseURI(string(b))
	if err != nil {
		return nwc.URI{}, fmt.Errorf("%s (%s): %w", field, filepath.Base(path), err)
	}
	return u, nil
}

// openNWC connects the configured NWC connections.
func (s *vendServer) openNWC(ctx context.Context) error {
	cfg := s.cfg
	for _, conn := range cfg.NWC.connections() {
		u, err := readNWCURI(conn.field, conn.uriFile)
		if err != nil {
			return err
		}
		c, err := nwc.NewClient(u, nwc.ClientConfig{Timeout: cfg.NWC.Timeout})
		if err != nil {
			return fmt.Errorf("%s: %w", conn.field, err)
		}
		s.closers = append(s.closers, func() error { c.Close(); return nil })
		b, err := nwc.New(ctx, c, s.l, nwc.Config{Name: conn.name, Hold: conn.hold, Grace: cfg.NWC.Grace, Log: s.log})
		if err != nil {
			return fmt.Errorf("%s: %w", conn.backend(), err)
		}
		s.backends = append(s.backends, b)
		s.rc.NWC = append(s.rc.NWC, nwc.NewReconciler(c, conn.name))
	}
	return nil
}

// The permissions capvend asks of a wallet connection, and those it must
// not be given. pay_invoice is granted only to pay refunds from the
// wallet ('refunds pay --nwc', 'credit refund --nwc'), with a budget.
var (
	nwcGrant     = "get_info, make_invoice, lookup_invoice, list_transactions; for hold invoices make_hold_invoice, settle_hold_invoice, cancel_hold_invoice; and the notifications payment_received, hold_invoice_accepted"
	nwcDontGrant = "pay_keysend, multi_pay_* and get_balance, and pay_invoice unless you pay refunds from this wallet (capvend never spends otherwise: a leaked URI then cannot spend it)"
	nwcSpend     = []string{"pay_keysend", "multi_pay_invoice", "multi_pay_keysend"}
)

// checkNWC checks each NWC connection: it connects, reads what it was
// granted, and says whether hold invoices are available and which
// permissions to grant or withdraw.
func checkNWC(ctx context.Context, cfg *Config) []outcome {
	var out []outcome
	for _, conn := range cfg.NWC.connections() {
		out = append(out, checkNWCConn(ctx, cfg, conn))
	}
	return out
}

func checkNWCConn(ctx context.Context, cfg *Config, conn nwcConn) outcome {
	name := string(conn.backend())
	u, err := readNWCURI(conn.field, conn.uriFile)
	if err != nil {
		return failed(name, "put the connection string from your wallet (Alby Hub: Connections > Add connection) in "+conn.uriFile, "%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	c, err := nwc.NewClient(u, nwc.ClientConfig{Timeout: checkTimeout})
	if err != nil {
		return failed(name, "check "+conn.field, "%v", err)
	}
	defer c.Close()
	s, err := c.Connect(ctx)
	switch {
	case errors.Is(err, nwc.ErrNoInfo):
		return failed(name, "check that the URI is the wallet's current one (the relay= it names carries the wallet's info event)", "%s: %v", u, err)
	case err != nil:
		return failed(name, "check that the wallet is online and its relay reachable", "%s: %v", u, err)
	}
	info := c.Info()
	if err := nwc.Granted(info, nwc.NeededMethods...); err != nil {
		return failed(name, "grant the connection "+nwcGrant, "%v", err)
	}
	detail := fmt.Sprintf("%s reachable (%s)", u.Relays[0], s.Encryption())
	hold := nwc.Granted(info, nwc.HoldMethods...) == nil
	switch {
	case hold && conn.hold && info.Notifies(nwc.NoteHoldInvoiceAccepted):
		detail += "; hold invoices available: a failed call's money returns by itself"
	case hold && conn.hold:
		detail += "; hold invoices available (no hold_invoice_accepted notification: capvend looks them up each second)"
	case conn.hold:
		detail += "; no hold invoices (grant make_hold_invoice, settle_hold_invoice, cancel_hold_invoice if the wallet offers them): a failed call's refund is owed"
	default:
		detail += "; hold invoices off (hold_invoices: false)"
	}
	if !info.Notifies(nwc.NotePaymentReceived) {
		detail += "; no payment_received notification: capvend looks payments up each second"
	}
	var spend []string
	for _, m := range nwcSpend {
		if info.Can(m) {
			spend = append(spend, m)
		}
	}
	if len(spend) > 0 {
		return failed(name, "make a connection without "+nwcDontGrant,
			"%s; but the connection may spend from the wallet (%s), which capvend never does", detail, strings.Join(spend, ", "))
	}
	if info.Can(nwc.MethodPayInvoice) {
		return warned(name, "give the connection a budget in the wallet (Alby Hub: the connection's budget), or make one without pay_invoice if you pay refunds from Cashu",
			"%s; the connection may pay invoices (pay_invoice): capvend pays from the wallet only the refunds and credit you pay with --nwc, but a leaked URI file spends up to its budget; granted %s",
			detail, strings.Join(info.Methods, " "))
	}
	return passed(name, "%s; granted %s", detail, strings.Join(info.Methods, " "))
}
