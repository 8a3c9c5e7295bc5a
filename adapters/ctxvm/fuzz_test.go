package ctxvm

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip44"
)

// Fuzz modes: how the fuzzed content travels.
const (
	fuzzPlain   = iota // an event of the fuzzed kind
	fuzzDVMCP          // kind 25910 with a method tag
	fuzzJob            // kind 5910 with a c tag
	fuzzWrapped        // in a ContextVM gift wrap (1059 or 21059)
	fuzzSealed         // a rumor in a NIP-59 seal in a gift wrap
	fuzzModes
)

// FuzzParse feeds arbitrary requests in every dialect and wrapping to the
// inbound checks: never a panic; nothing accepted unless its author's
// signature verifies (the event's own, or the seal's for a NIP-59 rumor
// by the seal's signer); an accepted request parses the same way again.
func FuzzParse(f *testing.F) {
	s, _ := recorder(f, nil)
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	f.Add(`{"jsonrpc":"2.0","id":1,"method":"ping"}`, KindMessage, int64(0), true, "", uint8(fuzzPlain), "")
	f.Add(`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"free"}}`, KindMessage, int64(10), false, "a", uint8(fuzzPlain), "")
	f.Add(`{"jsonrpc":"2.0"`, KindGiftWrap, int64(-400), true, "", uint8(fuzzPlain), "")
	f.Add(`AgAAAA==`, KindEphemeralGiftWrap, int64(0), true, "", uint8(fuzzPlain), "")
	f.Add(`{"jsonrpc":"2.0","id":1,"method":"ping"}`, KindMessage, int64(0), true, "", uint8(fuzzDVMCP), "ping")
	f.Add(`{"method":"tools/call","params":{"name":"free"}}`, KindMessage, int64(0), true, "", uint8(fuzzDVMCP), "tools/call")
	f.Add(`{"name":"free","parameters":{"text":"x"}}`, KindJobRequest, int64(0), true, "", uint8(fuzzJob), "execute-tool")
	f.Add(``, KindJobRequest, int64(0), true, "", uint8(fuzzJob), "list-tools")
	f.Add(`{"jsonrpc":"2.0","id":1,"method":"ping"}`, KindMessage, int64(0), true, "", uint8(fuzzWrapped), "")
	f.Add(`{"method":"ping"}`, KindMessage, int64(0), true, "", uint8(fuzzSealed), "ping")
	f.Add(`{"kind":25910,"tags":[["method","ping"]],"content":"{\"method\":\"ping\"}"}`, KindRumorDM, int64(0), true, "", uint8(fuzzSealed), "")
	f.Fuzz(func(t *testing.T, content string, kind int, skew int64, sign bool, sig string, mode uint8, tag string) {
		mode %= fuzzModes
		tags := nostr.Tags{{"p", s.PublicKey()}}
		switch mode {
		case fuzzDVMCP:
			kind = KindMessage
			tags = append(tags, nostr.Tag{"method", tag})
		case fuzzJob:
			kind = KindJobRequest
			tags = append(tags, nostr.Tag{"c", tag})
		}
		ev := &nostr.Event{Kind: kind, CreatedAt: nostr.Now() + nostr.Timestamp(skew), Content: content, Tags: tags}
		wrapKind := KindGiftWrap
		if skew%2 != 0 {
			wrapKind = KindEphemeralGiftWrap
		}
		switch mode {
		case fuzzSealed:
			// The rumor is by pk; the seal is signed by sk only if sign.
			ev.PubKey = pk
			ev.ID = ev.GetID()
			if tag == "badid" {
				ev.ID = sig
			}
			w, ok := fuzzSeal(ev, sk, sign, sig, s.PublicKey(), wrapKind)
			if !ok {
				return
			}
			ev = w
		case fuzzWrapped:
			sign1(ev, sk, sign, sig, s.PublicKey())
			w, ok := fuzzWrap(ev.String(), s.PublicKey(), wrapKind)
			if !ok {
				return
			}
			ev = w
		default:
			sign1(ev, sk, sign, sig, s.PublicKey())
		}
		r, err := s.parse(ev)
		if err != nil {
			return
		}
		if !sign {
			t.Fatal("accepted a request its author did not sign")
		}
		if r.wrap.nip59 {
			if r.ev.PubKey != pk || !r.ev.CheckID() {
				t.Fatal("accepted a rumor not by the seal's signer, or with a wrong id")
			}
		} else if ok, _ := r.ev.CheckSignature(); !ok || !r.ev.CheckID() {
			t.Fatal("accepted a bad signature")
		}
		switch r.dialect {
		case dialectContextVM, dialectRev1:
			if r.msg.JSONRPC != "2.0" {
				t.Fatal("accepted a non JSON-RPC message")
			}
		case dialectNIP90:
			if r.ev.Kind != KindJobRequest || r.command == "" {
				t.Fatal("a NIP-90 request that is not a job")
			}
		}
		if r.dialect != dialectNIP90 {
			d, m, err := parseMessage(r.ev)
			if err != nil || d != r.dialect || m.Method != r.msg.Method || string(m.ID) != string(r.msg.ID) {
				t.Fatalf("parsed differently again: %v %v %+v", d, err, m)
			}
		}
	})
}

// FuzzUnwrap puts arbitrary plaintext in a valid gift wrap, and in a
// valid seal in one: never a panic, and nothing accepted that is not
// signed (ContextVM) or not by the seal's signer (NIP-59).
func FuzzUnwrap(f *testing.F) {
	s, _ := recorder(f, nil)
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	inner := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: `{"jsonrpc":"2.0","id":1,"method":"ping"}`, Tags: nostr.Tags{{"p", s.PublicKey()}}}
	inner.Sign(sk)
	f.Add(inner.String(), false, false)
	rumor := *inner
	rumor.Sig = ""
	f.Add(rumor.String(), true, true)
	f.Add(`{"kind":13,"content":"AgAA","pubkey":"`+pk+`"}`, false, false)
	f.Add(`{"kind":14,"content":"{\"kind\":25910}","pubkey":"`+pk+`"}`, true, false)
	f.Add(`null`, true, true)
	f.Fuzz(func(t *testing.T, plain string, sealed, ephemeral bool) {
		kind := KindGiftWrap
		if ephemeral {
			kind = KindEphemeralGiftWrap
		}
		payload := plain
		if sealed {
			ck, _ := nip44.GenerateConversationKey(s.PublicKey(), sk)
			ct, err := nip44.Encrypt(plain, ck)
			if err != nil {
				return
			}
			seal := nostr.Event{Kind: KindSeal, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: ct}
			seal.Sign(sk)
			payload = seal.String()
		}
		w, ok := fuzzWrap(payload, s.PublicKey(), kind)
		if !ok {
			return
		}
		r, err := s.parse(w)
		if err != nil {
			return
		}
		if r.wrap.nip59 != sealed {
			t.Fatalf("wrapping %+v, sealed %v", r.wrap, sealed)
		}
		if sealed {
			if r.ev.PubKey != pk || !r.ev.CheckID() {
				t.Fatal("accepted a rumor not by the seal's signer, or with a wrong id")
			}
		} else if ok, _ := r.ev.CheckSignature(); !ok || !r.ev.CheckID() {
			t.Fatal("accepted a bad signature")
		}
	})
}

// sign1 signs ev with sk, or gives it recipient's pubkey, its id and sig.
func sign1(ev *nostr.Event, sk string, sign bool, sig, pub string) {
	if sign {
		ev.Sign(sk)
		return
	}
	ev.PubKey, ev.ID, ev.Sig = pub, ev.GetID(), sig
}

// fuzzWrap puts plain in a gift wrap of kind for recipient.
func fuzzWrap(plain, recipient string, kind int) (*nostr.Event, bool) {
	wsk := nostr.GeneratePrivateKey()
	ck, err := nip44.GenerateConversationKey(recipient, wsk)
	if err != nil {
		return nil, false
	}
	ct, err := nip44.Encrypt(plain, ck)
	if err != nil {
		return nil, false
	}
	w := &nostr.Event{Kind: kind, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", recipient}}, Content: ct}
	w.Sign(wsk)
	return w, true
}

// fuzzSeal seals rumor (signed by sk when sign, else carrying sig) and
// wraps it.
func fuzzSeal(rumor *nostr.Event, sk string, sign bool, sig, recipient string, kind int) (*nostr.Event, bool) {
	ck, err := nip44.GenerateConversationKey(recipient, sk)
	if err != nil {
		return nil, false
	}
	ct, err := nip44.Encrypt(rumor.String(), ck)
	if err != nil {
		return nil, false
	}
	seal := &nostr.Event{Kind: KindSeal, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: ct}
	if sign {
		seal.Sign(sk)
	} else {
		pub, _ := nostr.GetPublicKey(sk)
		seal.PubKey, seal.ID, seal.Sig = pub, seal.GetID(), sig
	}
	return fuzzWrap(seal.String(), recipient, kind)
}
