package vend

import (
	"errors"
	"fmt"
	"strings"
)

// Ways to pay.
//
// Every way a request can pay for a call, or prove it paid, is a Scheme:
// a row of one table (Schemes), declared in a file of its own
// (scheme_*.go), chosen once per request (choose) and enforced in one
// place (admitScheme). Each row answers the two questions every
// credential raises:
//
//   - Who else could present it? A bearer credential releases what it
//     names to whoever holds it (a Cashu token, a payment token, an L402
//     macaroon with its preimage, a credit token): it must be a secret
//     only its client learns. A bound credential releases only to the
//     client the quote was issued to (same transport and client: an MCP
//     session, a Nostr pubkey, stdio), whoever else learns it. A plain
//     Lightning invoice's preimage is learned at settlement by every
//     routing hop and by the payer's wallet or LSP: it is never a
//     bearer credential here (SchemePreimage is bound), so a client
//     without an identity (an anonymous MCP HTTP client) is released
//     only by a credential it alone holds: its payment token or L402
//     macaroon.
//   - Who could read it on the way? A request on a public channel (a
//     plaintext Nostr event: every relay and anyone reading it sees it;
//     CallRequest.Public) must carry no secret, and its answers must
//     carry none: a Private scheme's credential there is refused before
//     anything is spent (*PublicSecretError, naming encryption), and
//     nothing that would hand back a secret (Cashu change or refund
//     tokens, credit tokens, payment tokens, macaroons) is done for it.
//     MCP HTTP (point to point; TLS is the operator's), stdio and
//     encrypted Nostr are private channels.
//
// What a scheme releases is one call (the kind, item and canonical
// arguments it was quoted for: its Binding) or an account (a credit
// account, which pays any priced call its balance covers). A Nostr key's
// own account (SchemeCreditKey) is spent only by requests signed by that
// key: no token exists that spends it without the key.
//
// Every execution the ledger records names the scheme that released it
// and the request's transport and client (Release); `ledger verify`
// checks that a bound scheme released only its own client's call.

// SchemeName names a way to pay.
type SchemeName string

// The ways to pay (each declared in its file; Schemes is the table).
const (
	SchemeL402         SchemeName = "l402"          // scheme_l402.go: an L402 call macaroon with its preimage
	SchemeL402Credit   SchemeName = "l402_credit"   // scheme_l402.go: an L402 credit macaroon with its preimage
	SchemeMPP          SchemeName = "mpp"           // scheme_mpp.go: an MPP Payment credential (Lightning charge) with its preimage
	SchemeX402         SchemeName = "x402"          // scheme_x402.go: an x402 payment payload (exact, Lightning) from the quoted client
	SchemePaymentToken SchemeName = "payment_token" // scheme_token.go: the payment token of a payment-required answer
	SchemeCashu        SchemeName = "cashu"         // scheme_cashu.go: a Cashu token paying at once
	SchemeCreditToken  SchemeName = "credit_token"  // scheme_credit.go: a credit token's account pays
	SchemeCreditKey    SchemeName = "credit_key"    // scheme_credit.go: the signing Nostr key's own account pays
	SchemePreimage     SchemeName = "preimage"      // scheme_grant.go: the quoted client repeats with the invoice's preimage
	SchemeGrant        SchemeName = "grant"         // scheme_grant.go: the quoted client repeats the call
	SchemeInvoice      SchemeName = "invoice"       // scheme_invoice.go: the request waits for its invoice
	SchemeReplay       SchemeName = "replay"        // scheme_replay.go: the request key of a call recorded before
	SchemeRecover      SchemeName = "recover"       // recover.go: capvend finishes a paid call no request waits for
)

// Releases is what a scheme's credential releases.
type Releases string

// What a credential releases.
const (
	ReleasesCall    Releases = "call"    // the one recorded call it names: its kind, item and canonical arguments
	ReleasesPaid    Releases = "paid"    // the one call it comes with, which it pays at once
	ReleasesAccount Releases = "account" // a credit account: any priced call its balance covers
)

// Scheme is one way to pay and the rules of its credential.
type Scheme struct {
	Name SchemeName
	// Credential is what a request presents, in words.
	Credential string
	// Bearer: whoever holds the credential may use it. Otherwise it is
	// bound: it releases only to the client the quote was issued to
	// (the same transport and client).
	Bearer bool
	// Releases is what the credential releases.
	Releases Releases
	// Private: the credential, and what the scheme hands back, are
	// secrets that never travel on a public channel (a plaintext Nostr
	// event): a request carrying it there is refused.
	Private bool
	// HandsBack names the secrets the scheme's answers carry, "" none.
	HandsBack string
}

// Schemes returns the table of the ways to pay, in the order choose tries
// them. The table is what the admission enforces, what `ledger verify`
// checks executions against, and what redteam's cross-product test is
// generated from.
func Schemes() []Scheme {
	return []Scheme{schemeL402, schemeL402Credit, schemeMPP, schemeX402, schemePaymentToken, schemeCashu, schemeCreditToken,
		schemeCreditKey, schemePreimage, schemeGrant, schemeInvoice, schemeReplay, schemeRecover}
}

// SchemeByName returns the scheme of that name.
func SchemeByName(n SchemeName) (Scheme, bool) {
	for _, s := range Schemes() {
		if s.Name == n {
			return s, true
		}
	}
	return Scheme{}, false
}

// Release is who released a call for an execution: the scheme, and the
// transport and client of the request that presented its credential
// (the call's own for a scheme that serves no request: SchemeRecover).
// The ledger records it with the execution.
type Release struct {
	Scheme    SchemeName
	Transport string
	Client    string
}

// Check reports whether r may have released call c for an execution, by
// the table: a known scheme, and a bound one only to c's own client. It
// is what `ledger verify` checks each recorded execution with.
func (r Release) Check(c NewCall) error {
	s, ok := SchemeByName(r.Scheme)
	if !ok {
		return fmt.Errorf("released by an unknown scheme %q", r.Scheme)
	}
	if !s.Bearer && (r.Transport != c.Transport || r.Client != c.Client) {
		return fmt.Errorf("released by %s (bound) to %s %s, not to the call's client %s %s", s.Name, r.Transport, r.Client,
			c.Transport, c.Client)
	}
	return nil
}

// ErrPublicSecret matches a *PublicSecretError.
var ErrPublicSecret = errors.New("a bearer secret on a public channel")

// PublicSecretError refuses a request on a public channel (a plaintext
// Nostr event) that carries a bearer secret, or whose answer would: What
// names it. Nothing was recorded or spent. Fronts answer JSON-RPC -32600
// with a message naming encryption.
type PublicSecretError struct {
	What string
}

func (e *PublicSecretError) Error() string {
	return e.What + " is a bearer secret and a plaintext Nostr event is public: send the request encrypted (NIP-44 gift wrap)"
}

// Is makes errors.Is(err, ErrPublicSecret) true.
func (e *PublicSecretError) Is(target error) bool { return target == ErrPublicSecret }

// checkTravel refuses a request on a public channel that carries a
// private scheme's credential, whether or not that scheme is the one that
// pays (a top-up names the account it credits with a credit token, and
// pays by another). Run before anything is recorded or spent.
func checkTravel(r *CallRequest) error {
	if !r.Public {
		return nil
	}
	for _, c := range []struct {
		carried bool
		s       Scheme
		what    string
	}{
		{r.Macaroon != nil, schemeL402, "an L402 credential"},
		{r.MPP != "", schemeMPP, "an MPP Payment credential"},
		{len(r.X402) > 0, schemeX402, "an x402 payment (_meta[\"" + MetaX402Payment + "\"])"},
		{r.PaymentToken != "", schemePaymentToken, "a payment token (" + PaymentArg + ")"},
		{r.CashuToken != "", schemeCashu, "a Cashu token (_meta[\"" + MetaCashuToken + "\"])"},
		{r.Credit != "", schemeCreditToken, "a credit token"},
		{r.PaymentProof != "", schemePreimage, "a payment preimage (_meta[\"" + MetaPaymentProof + "\"])"},
	} {
		if c.carried && c.s.Private {
			return &PublicSecretError{What: c.what}
		}
	}
	return nil
}

// choosePayment picks the scheme that pays a new call of t requested by r
// (releaseGrant found no recorded call r's credential names): its account
// (a credit token's, the signing key's, or an L402 credit macaroon's)
// when r names one and t is not the top-up that credits it, else a Cashu
// token in r, else an invoice.
func choosePayment(t *Item, r *CallRequest) SchemeName {
	switch {
	case byCredit(t, r) && r.Macaroon != nil && r.Credit == "" && !r.CreditSelf:
		return SchemeL402Credit
	case byCredit(t, r) && r.Credit == "" && r.CreditSelf:
		return SchemeCreditKey
	case byCredit(t, r):
		return SchemeCreditToken
	case r.CashuToken != "":
		return SchemeCashu
	}
	return SchemeInvoice
}

// checkOutbound refuses, on a public channel, a request whose answer
// would hand back a secret whatever happens to it: a top-up of a token
// account (its answer carries the account's credit token). Answers that
// carry a secret only on some outcomes (a payment token, a macaroon, a
// Cashu refund) carry none there: see secretsAllowed.
func checkOutbound(t *Item, r *CallRequest) error {
	if r.Public && isTopUp(t) && !r.CreditSelf {
		return &PublicSecretError{What: "the credit token a top-up of a token account answers with (top up your key's own account " +
			"with _meta[\"" + MetaCredit + "\"] = true instead)"}
	}
	return nil
}

// secretsAllowed reports whether r's answers may carry bearer secrets
// (Cashu change and refund tokens, credit and payment tokens): not on a
// public channel.
func (r *CallRequest) secretsAllowed() bool { return !r.Public }

// SchemesMarkdown renders the table of the ways to pay as the Markdown
// table docs/ARCHITECTURE.md shows (a test keeps the two the same).
func SchemesMarkdown() string {
	var b strings.Builder
	b.WriteString("| scheme | credential | who may present it | releases | travels | hands back |\n|---|---|---|---|---|---|\n")
	for _, s := range Schemes() {
		who := "bound: its own client only"
		if s.Bearer {
			who = "bearer: whoever holds it"
		}
		where := "any channel"
		if s.Private {
			where = "never in plaintext Nostr"
		}
		back := s.HandsBack
		if back == "" {
			back = "nothing secret"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", s.Name, s.Credential, who, releasesWords[s.Releases], where, back)
	}
	return b.String()
}

// releasesWords says what a scheme releases, for people.
var releasesWords = map[Releases]string{
	ReleasesCall:    "the one call it names (kind, item, arguments)",
	ReleasesPaid:    "the call it comes with, paid at once",
	ReleasesAccount: "an account: any priced call its balance covers",
}
