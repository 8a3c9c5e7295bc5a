package ctxvm

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip44"

	"github.com/capvend/capvend/adapters/rpcerr"
)

func TestAccessLists(t *testing.T) {
	keys := map[string]string{} // name -> secret key
	pks := map[string]string{}
	for _, n := range []string{"friend", "foe", "stranger", "friendfoe"} {
		keys[n] = nostr.GeneratePrivateKey()
		pks[n], _ = nostr.GetPublicKey(keys[n])
	}
	for _, tc := range []struct {
		name        string
		allow, deny []string
		served      []string // the others are forbidden
	}{
		{"no lists", nil, nil, []string{"friend", "foe", "stranger", "friendfoe"}},
		{"deny", nil, []string{pks["foe"], strings.ToUpper(pks["friendfoe"])}, []string{"friend", "stranger"}},
		{"allow", []string{strings.ToUpper(pks["friend"]), pks["friendfoe"]}, nil, []string{"friend", "friendfoe"}},
		{"deny wins", []string{pks["friend"], pks["friendfoe"]}, []string{pks["friendfoe"]}, []string{"friend"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, out := recorder(t, func(c *Config) { c.Allow, c.Deny = tc.allow, tc.deny })
			for name, sk := range keys {
				served := false
				for _, n := range tc.served {
					served = served || n == name
				}
				for _, wrapped := range []bool{false, true} {
					*out = nil
					ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: `{"jsonrpc":"2.0","id":7,"method":"ping"}`,
						Tags: nostr.Tags{{"p", s.PublicKey()}}}
					ev.Sign(sk)
					if wrapped {
						// The wrap is signed by a random key: the inner
						// event's author is the one checked.
						ev = wrapFor(t, *ev, s.PublicKey())
					}
					s.handle(context.Background(), ev)
					if len(*out) != 1 {
						t.Fatalf("%s: %d answers", name, len(*out))
					}
					got := (*out)[0]
					if wrapped {
						got = unwrapAnswer(t, got, sk)
					}
					var r reply
					json.Unmarshal([]byte(got.Content), &r)
					switch {
					case served && (r.Error != nil || string(r.Result) != "{}"):
						t.Errorf("%s (wrapped %v) not served: %s", name, wrapped, got.Content)
					case !served && (r.Error == nil || r.Error.Code != rpcerr.CodeInvalidRequest || r.Error.Message != "Forbidden" || string(r.ID) != "7"):
						t.Errorf("%s (wrapped %v) not forbidden: %s", name, wrapped, got.Content)
					}

					// Notifications are never answered, forbidden or not.
					*out = nil
					n := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
						Tags: nostr.Tags{{"p", s.PublicKey()}}}
					n.Sign(sk)
					s.handle(context.Background(), n)
					if len(*out) != 0 {
						t.Errorf("%s: a notification was answered: %v", name, (*out)[0].Content)
					}
				}
			}
		})
	}
}

// unwrapAnswer decrypts a gift-wrapped answer for the client sk.
func unwrapAnswer(t *testing.T, w nostr.Event, sk string) nostr.Event {
	t.Helper()
	ck, err := nip44.GenerateConversationKey(w.PubKey, sk)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := nip44.Decrypt(w.Content, ck)
	if err != nil {
		t.Fatal(err)
	}
	var inner nostr.Event
	if err := json.Unmarshal([]byte(plain), &inner); err != nil {
		t.Fatal(err)
	}
	return inner
}

func TestAccessListsValidated(t *testing.T) {
	pk := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		allow, deny []string
		want        string
	}{
		{[]string{pk, "npub1xyz"}, nil, "Allow[1]"},
		{nil, []string{pk, pk, pk[:62]}, "Deny[2]"},
		{[]string{pk + "00"}, nil, "Allow[0]"},
	} {
		_, err := New(Config{Vendor: &fakeVendor{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{"ws://x"}, Allow: tc.allow, Deny: tc.deny})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: err %v, want %s", tc.allow, tc.deny, err, tc.want)
		}
	}
}
