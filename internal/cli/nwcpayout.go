package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// nwcFlag is --nwc[=NAME]: pay from the wallet of an NWC connection
// instead of the Cashu wallet. NAME is a connection of nwc.wallets (or
// "nwc" for nwc.uri_file); without it, the first configured.
type nwcFlag struct {
	set  bool
	name string
}

func (f *nwcFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.name
}

func (f *nwcFlag) Set(s string) error {
	switch s {
	case "true":
		f.set, f.name = true, ""
	case "false":
		f.set, f.name = false, ""
	default:
		f.set, f.name = true, strings.TrimPrefix(s, "nwc:")
	}
	return nil
}

// IsBoolFlag lets --nwc stand alone (flag package), --nwc=NAME naming one.
func (f *nwcFlag) IsBoolFlag() bool { return true }

// hint adds to err, a command line's usage error, that a bare --nwc takes
// no NAME after a space: "--nwc coinos 3" reads "coinos" as the argument.
func (f *nwcFlag) hint(err error) error {
	if f.set && f.name == "" {
		return usageError("%v (--nwc names a connection only with '=': --nwc=NAME)", err)
	}
	return err
}

// pickNWC returns the configured connection name names ("" the first).
func pickNWC(cfg *Config, name string) (nwcConn, error) {
	conns := cfg.NWC.connections()
	if len(conns) == 0 {
		return nwcConn{}, usageError("--nwc: no NWC connection is configured (nwc.uri_file or nwc.wallets)")
	}
	if name == "" {
		return conns[0], nil
	}
	var names []string
	for _, c := range conns {
		if c.name == name || (c.name == "" && name == string(vend.BackendNWC)) {
			return c, nil
		}
		names = append(names, string(c.backend()))
	}
	return nwcConn{}, usageError("--nwc=%s: no such NWC connection (configured: %s)", name, strings.Join(names, ", "))
}

// nwcPayer is a payer on a configured NWC connection and the ledger it
// books into.
type nwcPayer struct {
	*nwc.Payer
	l    *ledger.Ledger
	c    *nwc.Client
	conn nwcConn
}

func (p *nwcPayer) Close() {
	p.c.Close()
	p.l.Close()
}

// openNWCPayer loads the configuration, opens the existing ledger and
// connects the NWC connection name (see pickNWC). The connection's URI
// file is a secret: its mode is checked, its content never shown. The
// connection need not be idle: the ledger's reservation decides between
// payers, capvend serve included.
func openNWCPayer(ctx context.Context, e *env, cf *cashuFlags, name string) (*nwcPayer, error) {
	cfg, err := loadConfig(cf.config, e.Getenv)
	if err != nil {
		return nil, err
	}
	conn, err := pickNWC(cfg, name)
	if err != nil {
		return nil, err
	}
	if err := checkSecretFile(conn.field, conn.uriFile); err != nil {
		return nil, err
	}
	u, err := readNWCURI(conn.field, conn.uriFile)
	if err != nil {
		return nil, err
	}
	c, err := nwc.NewClient(u, nwc.ClientConfig{Timeout: cfg.NWC.Timeout})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", conn.field, err)
	}
	l, err := cfg.Ledger.open(ctx, cf.db, ledger.Options{MustExist: true})
	if err != nil {
		return nil, err
	}
	p, err := nwc.NewPayer(c, l, nwc.PayerConfig{Name: conn.name, Failpoint: failpoints(e.Getenv), Log: e.Log})
	if err != nil {
		l.Close()
		return nil, err
	}
	if _, err := c.Connect(ctx); err != nil {
		l.Close()
		return nil, fmt.Errorf("%s: %w (is the wallet online, its relay reachable?)", conn.backend(), err)
	}
	return &nwcPayer{Payer: p, l: l, c: c, conn: conn}, nil
}

// payRefundNWC is 'refunds pay ID --nwc[=NAME]'.
func payRefundNWC(ctx context.Context, e *env, pf *payoutFlags, id vend.RefundID) error {
	if pf.payCashu || pf.mint != "" {
		return usageError("--nwc pays a bolt11 from the NWC wallet: it excludes --cashu and --mint")
	}
	p, err := openNWCPayer(ctx, e, &pf.cf, pf.nwc.name)
	if err != nil {
		return err
	}
	defer p.Close()
	r, res, err := p.PayRefund(ctx, id, pf.invoice)
	if err != nil {
		if errors.Is(err, nwc.ErrNoRefundInvoice) {
			return &exitError{code: 1, err: fmt.Errorf("refund %d: the client gave no refund invoice: pass --invoice BOLT11", id)}
		}
		return refundError(err)
	}
	fmt.Fprintf(e.Stdout, "refund %d (call %d) paid: %s to %s %s's invoice (fee %s) from the wallet of %s\npayment hash %s\npreimage     %s\n",
		r.ID, r.CallID, res.Amount, r.Transport, r.Client, res.Fee, p.conn.backend(), res.PaymentHash, orUnknown(res.Preimage))
	return nil
}

// payCreditNWC is 'credit refund ACCOUNT --nwc[=NAME] --invoice BOLT11'.
func payCreditNWC(ctx context.Context, e *env, pf *payoutFlags, account string) error {
	if pf.payCashu || pf.mint != "" {
		return usageError("--nwc pays a bolt11 from the NWC wallet: it excludes --cashu and --mint")
	}
	if strings.TrimSpace(pf.invoice) == "" {
		return usageError("--nwc pays the client's invoice: pass --invoice BOLT11")
	}
	p, err := openNWCPayer(ctx, e, &pf.cf, pf.nwc.name)
	if err != nil {
		return err
	}
	defer p.Close()
	cp, res, err := p.PayCredit(ctx, account, pf.invoice)
	if err != nil {
		return refundError(err)
	}
	fmt.Fprintf(e.Stdout, "credit %s refunded: %s to the invoice (fee %s) from the wallet of %s\npayment hash %s\npreimage     %s\n",
		account, cp.Paid, cp.Fee, cp.NWC, res.PaymentHash, orUnknown(res.Preimage))
	return nil
}

func orUnknown(s string) string {
	if s == "" {
		return "(the wallet did not say)"
	}
	return s
}
