package cli

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

func l402Command() *command {
	return &command{
		Name:    "l402",
		Summary: "L402 tokens: 'l402 list' shows the revoked ones, 'l402 revoke TOKEN' refuses one from now on",
		Help: `L402 tokens (payments.http_402, or an Accept naming L402, on MCP HTTP) are
macaroons capvend signs with a root key kept in the ledger: a call token pays
one call, a credit token (capvend_topup over L402) pays calls from its
account's balance. capvend stores no token; it checks each one when it is
presented. A revoked token is refused (HTTP 401) whatever its signature and
preimage say, at once, also by a running 'capvend serve'. Revocations are
rows of the ledger (l402_revocations) and are never withdrawn.`,
		Run: func(ctx context.Context, e *env, args []string) error {
			return usageError("say what to do: 'capvend l402 list' or 'capvend l402 revoke TOKEN'")
		},
		Subs: []*command{l402ListCommand(), l402RevokeCommand()},
	}
}

func l402ListCommand() *command {
	var lf ledgerFlags
	return &command{
		Name:    "list",
		Summary: "list the revoked L402 tokens",
		Help: `Lists every revoked L402 token, oldest first: its token id (64 hex digits),
the call it names (the call a call token pays, or the top-up of a credit
token), when it was revoked and why. Safe while 'capvend serve' runs.

Example:
  capvend l402 list`,
		Flags: lf.register,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("list takes no arguments, got %q", args[0])
			}
			l, err := lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			revs, err := l.L402Revocations(ctx)
			if err != nil {
				return err
			}
			return writeRevocations(e.Stdout, revs)
		},
	}
}

// writeRevocations prints revoked tokens as a table and their count.
func writeRevocations(w io.Writer, revs []ledger.L402Revocation) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN ID\tCALL\tREVOKED\tREASON")
	for _, r := range revs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", r.TokenID, r.Call, r.At.UTC().Format(time.DateTime), r.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d L402 token(s) revoked\n", len(revs))
	return err
}

type l402RevokeFlags struct {
	lf     ledgerFlags
	reason string
}

func (f *l402RevokeFlags) register(fs *flag.FlagSet) {
	f.lf.register(fs)
	fs.StringVar(&f.reason, "reason", "revoked by the operator", "why, kept with the revocation (`TEXT`)")
}

func l402RevokeCommand() *command {
	var f l402RevokeFlags
	return &command{
		Name:    "revoke",
		Args:    "TOKEN",
		Summary: "revoke an L402 token: it is refused from now on",
		Help: `Revokes an L402 token: from now on a request presenting it gets HTTP 401
and nothing runs or is drawn, also in a running 'capvend serve'. TOKEN is
the token id (64 hex digits, as 'capvend l402 list' shows it), or the
macaroon itself (base64, as in the WWW-Authenticate or Authorization
header; an "L402 <macaroon>:<preimage>" credential works too): its id is
read from it. Revoking a credit token stops that token, not the account's
balance: 'capvend credit refund' pays it back. Revoking twice changes
nothing.

Examples:
  capvend l402 revoke 00000000000000070a1b...
  capvend l402 revoke AgEHY2FwdmVuZA... --reason "leaked in a log"`,
		Flags: f.register,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) == 0 {
				return usageError("revoke takes the TOKEN (see 'capvend l402 revoke --help')")
			}
			if err := parseAfterArg("l402 revoke", "revoke takes one TOKEN", args, f.register); err != nil {
				return err
			}
			id, err := l402TokenID(args[0])
			if err != nil {
				return usageError("%v", err)
			}
			l, err := f.lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			if err := l.RevokeL402(ctx, id, f.reason); err != nil {
				return err
			}
			b, _ := hex.DecodeString(id)
			fmt.Fprintf(e.Stdout, "L402 token %s (call %d) revoked\n", id, vend.CallID(binary.BigEndian.Uint64(b)))
			return nil
		},
	}
}

// l402TokenID reads a token id from what an operator has of a token: the
// id itself, the macaroon (base64), or a credential "[L402 ]mac:preimage".
func l402TokenID(s string) (string, error) {
	s = strings.TrimSpace(s)
	if b, err := hex.DecodeString(s); err == nil && len(b) == 32 {
		return strings.ToLower(s), nil
	}
	if scheme, rest, ok := strings.Cut(s, " "); ok && (strings.EqualFold(scheme, "L402") || strings.EqualFold(scheme, "LSAT")) {
		s = strings.TrimSpace(rest)
	}
	s, _, _ = strings.Cut(s, ":")
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if mac, err := enc.DecodeString(s); err == nil && len(mac) > 0 {
			if id, err := vend.L402TokenID(mac); err == nil {
				return id, nil
			}
			break
		}
	}
	return "", fmt.Errorf("%q is no L402 token: want its id (64 hex digits) or its macaroon (base64)", s)
}
