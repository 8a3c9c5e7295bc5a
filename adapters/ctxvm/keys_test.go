package ctxvm

import (
	"os"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"
)

func TestParseSecretKey(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	nsec, _ := nip19.EncodePrivateKey(sk)
	for _, in := range []string{sk, strings.ToUpper(sk), nsec, "\n " + nsec + "\n"} {
		if got, err := ParseSecretKey(in); err != nil || got != sk {
			t.Errorf("%q: %q %v", in, got, err)
		}
	}
	npub, _ := nip19.EncodePublicKey(sk)
	for _, in := range []string{"", sk[:63], sk + "00", strings.Repeat("0", 64), npub, "nsec1" + sk, badChecksum(nsec)} {
		_, err := ParseSecretKey(in)
		if err == nil {
			t.Errorf("%q accepted", in)
		} else if len(in) > 8 && strings.Contains(err.Error(), in) {
			t.Errorf("error quotes the key: %v", err)
		}
	}
	dir := t.TempDir()
	path := dir + "/key"
	if err := writeFile(path, nsec+"\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadSecretKey(path); err != nil || got != sk {
		t.Errorf("LoadSecretKey: %q %v", got, err)
	}
	writeFile(path, "nsec1notakey")
	if _, err := LoadSecretKey(path); err == nil || strings.Contains(err.Error(), "notakey") || !strings.Contains(err.Error(), path) {
		t.Errorf("LoadSecretKey of a bad key: %v", err)
	}
}

// badChecksum changes the last character of a bech32 string.
func badChecksum(s string) string {
	last := "q"
	if strings.HasSuffix(s, "q") {
		last = "p"
	}
	return s[:len(s)-1] + last
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }

func TestParsePublicKey(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	npub, _ := nip19.EncodePublicKey(pk)
	nsec, _ := nip19.EncodePrivateKey(sk)
	for _, in := range []string{pk, strings.ToUpper(pk), npub, " " + npub + "\n"} {
		if got, err := ParsePublicKey(in); err != nil || got != pk {
			t.Errorf("%q: %q %v", in, got, err)
		}
	}
	for _, in := range []string{"", pk[:63], pk + "00", nsec, "npub1" + pk, badChecksum(npub)} {
		if got, err := ParsePublicKey(in); err == nil {
			t.Errorf("%q accepted as %q", in, got)
		}
	}
}
