package lnd

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
)

// Mark is the key of the mark every preimage capvend makes carries: the
// ledger's identity (ledger.InvoiceMark), which travels with its backups
// and replicas. A preimage is a random nonce and its HMAC under the mark,
// 16 bytes each: uniform to anyone without the mark, and recognizable by
// a ledger restored from a replica as one of its own invoices whose
// quote it lost (reconcile: settled, and no payment names it). LND
// reports a preimage only once the invoice is settled: an accepted hold
// invoice whose preimage was lost cannot be recognized (nor settled); it
// is canceled by LND when its HTLC nears expiry, and the payer keeps the
// money.
type Mark []byte

// markLabel separates the mark's HMAC from any other use of the key.
const markLabel = "capvend invoice preimage\x00"

// NewPreimage returns a new preimage: marked if m is set, else 32 random
// bytes.
func (m Mark) NewPreimage() ([]byte, error) {
	pre := make([]byte, 32)
	if _, err := rand.Read(pre[:16]); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		if _, err := rand.Read(pre[16:]); err != nil {
			return nil, err
		}
		return pre, nil
	}
	copy(pre[16:], m.mac(pre[:16]))
	return pre, nil
}

func (m Mark) mac(nonce []byte) []byte {
	h := hmac.New(sha256.New, m)
	h.Write([]byte(markLabel))
	h.Write(nonce)
	return h.Sum(nil)[:16]
}

// Owns reports whether pre is a preimage made under m.
func (m Mark) Owns(pre []byte) bool {
	if len(m) == 0 || len(pre) != 32 {
		return false
	}
	return hmac.Equal(pre[16:], m.mac(pre[:16]))
}
