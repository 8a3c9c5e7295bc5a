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

// discoveryDoc is the discovery document (README, Discovery).
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
