// Package journal holds the double-entry journal's types and the account
// names that several packages build: the ledger books them, and the
// billing backends and operator commands name the accounts of what they
// move (ecash per mint, fees). It is a leaf: billing/cashu uses it
// without depending on the ledger. The ledger re-exports each name.
package journal

import (
	"net/url"
	"strings"

	"github.com/capvend/capvend/vend"
)

// Posting is one line of a journal entry: a signed amount on an account.
// Debits are positive, credits negative.
type Posting struct {
	Account string
	Amount  vend.Msat
}

// Entry is a balanced journal entry.
type Entry struct {
	Kind        string // settlement, refund, fee, melt, adjustment
	Description string
	CallID      vend.CallID    // 0 if none
	PaymentID   vend.PaymentID // 0 if none
	Postings    []Posting
}

// CashuAccount is the ecash held at one mint: assets:cashu:<mint host>.
func CashuAccount(mintURL string) string { return "assets:cashu:" + mintSegment(mintURL) }

// CashuFeeAccount is what a mint charged us: expenses:fees:cashu:<mint host>.
func CashuFeeAccount(mintURL string) string { return "expenses:fees:cashu:" + mintSegment(mintURL) }

// LightningFeeAccount is routing fees we paid: expenses:fees:lightning.
const LightningFeeAccount = "expenses:fees:lightning"

func mintSegment(mintURL string) string {
	if u, err := url.Parse(mintURL); err == nil && u.Host != "" {
		return Segment(strings.Trim(u.Host+u.Path, "/"))
	}
	return Segment(mintURL)
}

// Segment makes s safe as one account name segment: characters outside
// [A-Za-z0-9._-] become '-', and an empty segment becomes "-".
func Segment(s string) string {
	if s == "" {
		return "-"
	}
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}
