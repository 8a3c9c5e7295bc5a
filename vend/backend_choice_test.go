package vend

import (
	"testing"
)

// namedBackend is a PaymentBackend that only has a name.
type namedBackend struct {
	PaymentBackend
	name Backend
}

func (b namedBackend) Name() Backend { return b.name }

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

// downBackend is a namedBackend that says whether it is available.
type downBackend struct {
	namedBackend
	up bool
}

func (b downBackend) Available() bool { return b.up }

func TestChooseBackendFallsBackWhenUnavailable(t *testing.T) {
	nwcDown := downBackend{namedBackend{name: BackendNWC}, false}
	nwcUp := downBackend{namedBackend{name: NWCBackend("hub")}, true}
	lnd := namedBackend{name: BackendLND}
	for _, tc := range []struct {
		name     string
		backends []PaymentBackend
		from     Backend
		want     PaymentBackend
	}{
		{"preferred wallet out of reach: the next", []PaymentBackend{nwcDown, lnd}, "", lnd},
		{"asked for a wallet out of reach: the first available", []PaymentBackend{nwcDown, nwcUp, lnd}, BackendNWC, nwcUp},
		{"asked for an available wallet", []PaymentBackend{lnd, nwcUp}, NWCBackend("hub"), nwcUp},
		{"none available: the first all the same", []PaymentBackend{nwcDown}, "", nwcDown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &Vendor{cfg: Config{Backends: tc.backends}}
			if got := v.chooseBackend(nil, tc.from); got != tc.want {
				t.Fatalf("chooseBackend(%q) = %v, want %v", tc.from, got, tc.want)
			}
		})
	}
}
