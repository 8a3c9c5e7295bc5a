package vend

import (
	"testing"
)

// namedBackend is a PaymentBackend that only has a name.
type namedBackend struct {
	PaymentBackend
	name Backend
}

func (b namedBackend) Backend() Backend { return b.name }

func TestChooseBackend(t *testing.T) {
	lnd, cashu := namedBackend{name: BackendLND}, namedBackend{name: BackendCashu}
	v := &Vendor{cfg: Config{Backends: []PaymentBackend{lnd, cashu}}}
	for _, tc := range []struct {
		name string
		pmis []string
		from Backend
		want PaymentBackend
	}{
		{"default is the first", nil, "", lnd},
		{"asked for cashu", nil, BackendCashu, cashu},
		{"asked for lnd", []string{PMILightning}, BackendLND, lnd},
		{"unknown backend falls back", nil, "ledger", lnd},
		{"client cannot pay bolt11", []string{PMICashu}, BackendCashu, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := v.chooseBackend(tc.pmis, tc.from); got != tc.want {
				t.Fatalf("chooseBackend(%v, %q) = %v, want %v", tc.pmis, tc.from, got, tc.want)
			}
		})
	}
	if got := (&Vendor{}).chooseBackend(nil, BackendCashu); got != nil {
		t.Fatalf("no backends: got %v", got)
	}
}
