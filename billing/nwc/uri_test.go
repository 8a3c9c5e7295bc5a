package nwc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/capvend/capvend/billing/nwc"
)

const (
	testWallet = "b889ff5b1513b641e2a139f661a661364979c5beee91842f8f0ef42ab558e9d4"
	testSecret = "71a8c14c1407c113601079c4302dab36460f0ccd0ad506f1f2dc73b5100e4f3c"
)

func TestParseURI(t *testing.T) {
	good := "nostr+walletconnect://" + testWallet + "?relay=wss%3A%2F%2Frelay.damus.io&relay=ws://127.0.0.1:7777&secret=" + testSecret + "&lud16=me@example.com"
	u, err := nwc.ParseURI(good + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if u.Wallet != testWallet || len(u.Relays) != 2 || u.Relays[0] != "wss://relay.damus.io" || u.Secret != testSecret || u.LUD16 != "me@example.com" {
		t.Fatalf("parsed %+v", u)
	}
	if s := u.String(); strings.Contains(s, testSecret) || !strings.Contains(s, "secret=(hidden)") {
		t.Fatalf("String shows the secret: %s", s)
	}
	if again, err := nwc.ParseURI(u.Encode()); err != nil || again.Secret != u.Secret || again.Wallet != u.Wallet || len(again.Relays) != 2 {
		t.Fatalf("Encode does not round-trip: %+v %v", again, err)
	}
	for name, bad := range map[string]string{
		"scheme":    "https://" + testWallet + "?relay=wss://r&secret=" + testSecret,
		"pubkey":    "nostr+walletconnect://abc?relay=wss://r&secret=" + testSecret,
		"no secret": "nostr+walletconnect://" + testWallet + "?relay=wss://r",
		"no relay":  "nostr+walletconnect://" + testWallet + "?secret=" + testSecret,
		"http":      "nostr+walletconnect://" + testWallet + "?relay=http://r&secret=" + testSecret,
	} {
		_, err := nwc.ParseURI(bad)
		if !errors.Is(err, nwc.ErrBadURI) || strings.Contains(err.Error(), testSecret) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestWalletErrorCodes(t *testing.T) {
	for code, want := range map[string]error{"NOT_FOUND": nwc.ErrNotFound, "RESTRICTED": nwc.ErrRestricted,
		"RATE_LIMITED": nwc.ErrRateLimited, "QUOTA_EXCEEDED": nwc.ErrQuotaExceeded, "SOMETHING_NEW": nwc.ErrOther} {
		err := error(&nwc.WalletError{Method: "lookup_invoice", Code: code})
		if !errors.Is(err, want) || !strings.Contains(err.Error(), code) {
			t.Errorf("%s: %v does not match %v", code, err, want)
		}
	}
}

// FuzzParseURI: a connection string never panics the parser, and one that
// parses round-trips through Encode.
func FuzzParseURI(f *testing.F) {
	f.Add("nostr+walletconnect://" + testWallet + "?relay=wss%3A%2F%2Fr.example&secret=" + testSecret)
	f.Add("nostr+walletconnect://" + testWallet + "?relay=ws://127.0.0.1:1&relay=wss://x&secret=" + testSecret + "&lud16=a@b")
	f.Add("nostrwalletconnect://x?y")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := nwc.ParseURI(s)
		if err != nil {
			return
		}
		again, err := nwc.ParseURI(u.Encode())
		if err != nil || again.Wallet != u.Wallet || again.Secret != u.Secret || strings.Join(again.Relays, " ") != strings.Join(u.Relays, " ") {
			t.Fatalf("%q does not round-trip: %+v %v", s, again, err)
		}
	})
}
