package mcpfront

import (
	"encoding/json"
	"net/http"
	"sort"

	"github.com/capvend/capvend/vend"
)

// DiscoveryPath is where the HTTP listener serves the discovery document
// (see Discovery).
const DiscoveryPath = "/.well-known/capvend.json"

// DiscoveryInfo is what the discovery document says that the front cannot
// know from its Vendor: the wiring's payment setup and Nostr identity.
type DiscoveryInfo struct {
	MCPPath     string   // the path of the MCP endpoint on this listener, e.g. "/mcp"
	PMIs        []string // payment methods accepted (vend.PMILightning, vend.PMICashu, ...)
	Mints       []string // trusted Cashu mints, the first issuing mint quotes
	RelayPubkey string   // the server's Nostr pubkey (hex), "" without a Nostr front
	Relays      []string // the relays it answers on
	// L402: unpaid calls can be answered with L402 challenges (an LND
	// backend issues the invoices: a mint quote's invoice has no
	// payment hash of capvend's to bind a macaroon to).
	L402 bool
}

// discoveryDoc is the discovery document (docs/PAYING.md, Discovery).
type discoveryDoc struct {
	Name     string          `json:"name"`
	Version  string          `json:"version"`
	MCP      string          `json:"mcp"`
	Tools    []discoveryTool `json:"tools"`
	Payments discoveryPay    `json:"payments"`
	Nostr    *discoveryNostr `json:"nostr,omitempty"`
}

type discoveryTool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	PriceMsat   int64  `json:"price_msat"`               // least a call costs
	MaxMsat     int64  `json:"max_price_msat,omitempty"` // most, when the price depends on the arguments
	PriceSats   int64  `json:"price_sats"`               // price_msat rounded up
	MaxSats     int64  `json:"max_price_sats,omitempty"`
}

type discoveryPay struct {
	PMIs  []string       `json:"pmis"`
	Mints []string       `json:"mints"`
	L402  discoveryL402  `json:"l402"`
	Token discoveryToken `json:"payment_token"`
	// HTTP402 is the order of the challenges of an HTTP 402.
	HTTP402 []string `json:"http_402_challenges"`
	// Schemes is every way to pay (vend.Schemes), with how it travels.
	Schemes []discoveryScheme `json:"schemes"`
}

// discoveryScheme is one row of vend.Schemes and its wire parameters.
type discoveryScheme struct {
	Name       string            `json:"name"`
	Credential string            `json:"credential"`
	Bearer     bool              `json:"bearer"`
	Releases   string            `json:"releases"`
	Private    bool              `json:"private"`
	HandsBack  string            `json:"hands_back,omitempty"`
	Offered    bool              `json:"offered"`
	Params     map[string]string `json:"params,omitempty"`
}

type discoveryL402 struct {
	Supported bool   `json:"supported"`
	Always    bool   `json:"always"` // payments.http_402: every unpaid priced call gets 402
	Accept    string `json:"accept"` // an Accept media type that asks for 402
	Service   string `json:"service"`
}

type discoveryToken struct {
	Argument string `json:"argument"`
	Meta     string `json:"meta"`
}

type discoveryNostr struct {
	Pubkey string   `json:"pubkey"`
	Relays []string `json:"relays"`
}

// Discovery returns the handler of DiscoveryPath: a JSON document of the
// tools offered now with their prices (msat and sats; free tools at 0),
// the payment methods and mints accepted, L402 support, the payment
// token argument, and the Nostr pubkey and relays. GET and HEAD only;
// nothing secret is in it. It passes the front's Origin check (a browser
// page of another origin cannot read it unless allowed) but not the
// bearer token: it describes what is sold, to anyone who may buy.
func (s *Server) Discovery(info DiscoveryInfo) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if !s.originAllowed(r) {
			http.Error(w, "Forbidden: Origin not allowed", http.StatusForbidden)
			return
		}
		b, err := json.MarshalIndent(s.discovery(info), "", "  ")
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(append(b, '\n'))
	})
}

// discovery builds the document from the Vendor's tools now.
func (s *Server) discovery(info DiscoveryInfo) discoveryDoc {
	ranger, _ := s.cfg.Vendor.(PriceRanger)
	doc := discoveryDoc{Name: s.cfg.Name, Version: s.cfg.Version, MCP: info.MCPPath, Tools: []discoveryTool{},
		Payments: discoveryPay{PMIs: nonNil(info.PMIs), Mints: nonNil(info.Mints),
			L402:  discoveryL402{Supported: true, Always: s.cfg.HTTP402, Accept: "application/vnd.l402", Service: vend.L402Service},
			Token: discoveryToken{Argument: vend.PaymentArg, Meta: vend.MetaPaymentToken}}}
	doc.Payments.HTTP402 = s.schemes402()
	doc.Payments.Schemes = s.discoverySchemes(info)
	for _, t := range s.cfg.Vendor.Tools() {
		lo, hi := t.Price, t.Price
		if ranger != nil {
			lo, hi = ranger.ListedPrice(t)
		}
		dt := discoveryTool{Name: t.Name, Description: t.Description, PriceMsat: int64(lo), PriceSats: lo.SatsCeil()}
		if hi > lo {
			dt.MaxMsat, dt.MaxSats = int64(hi), hi.SatsCeil()
		}
		doc.Tools = append(doc.Tools, dt)
	}
	sort.Slice(doc.Tools, func(i, j int) bool { return doc.Tools[i].Name < doc.Tools[j].Name })
	if info.RelayPubkey != "" {
		doc.Nostr = &discoveryNostr{Pubkey: info.RelayPubkey, Relays: nonNil(info.Relays)}
	}
	return doc
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// discoverySchemes lists vend.Schemes with the parameters a client needs
// to use each: the headers, _meta keys or arguments that carry it, and
// whether this server offers it (the 402 schemes need an LND backend;
// MPP is challenged only where the 402's order lists it).
func (s *Server) discoverySchemes(info DiscoveryInfo) []discoveryScheme {
	listed := map[string]bool{}
	for _, n := range s.schemes402() {
		listed[n] = true
	}
	cashu := len(info.Mints) > 0
	var out []discoveryScheme
	for _, sc := range vend.Schemes() {
		d := discoveryScheme{Name: string(sc.Name), Credential: sc.Credential, Bearer: sc.Bearer, Releases: string(sc.Releases),
			Private: sc.Private, HandsBack: sc.HandsBack, Offered: true}
		switch sc.Name {
		case vend.SchemeL402, vend.SchemeL402Credit:
			d.Offered = info.L402 && listed[SchemeL402]
			d.Params = map[string]string{"challenge": "WWW-Authenticate: L402 macaroon=\"...\", invoice=\"...\"",
				"credential": "Authorization: L402 <base64 macaroon>:<hex preimage>", "service": vend.L402Service}
		case vend.SchemeMPP:
			d.Offered = info.L402 && listed[SchemeMPP]
			d.Params = map[string]string{"challenge": "WWW-Authenticate: Payment", "method": vend.MPPMethod, "intent": vend.MPPIntent,
				"realm": vend.MPPRealm, "credential": "Authorization: Payment <base64url JCS credential>", "receipt": HeaderMPPReceipt}
		case vend.SchemeX402:
			d.Offered = info.L402
			d.Params = map[string]string{"x402Version": "2", "scheme": vend.X402Scheme, "paymentMethod": vend.X402PaymentMethod,
				"challenge": HeaderX402Required, "credential": HeaderX402Payment, "response": HeaderX402Response,
				"mcp_meta": vend.MetaX402Payment, "mcp_response_meta": vend.MetaX402Response}
		case vend.SchemePaymentToken:
			d.Params = map[string]string{"argument": vend.PaymentArg, "meta": vend.MetaPaymentToken}
		case vend.SchemeCashu:
			d.Offered = cashu
			d.Params = map[string]string{"meta": vend.MetaCashuToken, "header": HeaderCashu}
		case vend.SchemeCreditToken:
			d.Params = map[string]string{"meta": vend.MetaCredit, "header": vend.HeaderCredit, "argument": vend.CreditArg}
		case vend.SchemeCreditKey:
			d.Offered = info.RelayPubkey != ""
			d.Params = map[string]string{"meta": vend.MetaCredit + " = true"}
		case vend.SchemePreimage:
			d.Params = map[string]string{"meta": vend.MetaPaymentProof}
		}
		out = append(out, d)
	}
	return out
}
