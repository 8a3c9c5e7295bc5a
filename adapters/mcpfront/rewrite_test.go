package mcpfront

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/capvend/capvend/vend"
)

// FuzzRewrite: the rewriter never panics, leaves messages without this
// Server's nonce alone, and always yields valid JSON from valid JSON.
func FuzzRewrite(f *testing.F) {
	s, err := New(Config{Vendor: &fakeVendor{}})
	if err != nil {
		f.Fatal(err)
	}
	marked := s.markError(vend.ErrLimit, "x").Error()
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"` + marked + `"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"a","result":{"_meta":{"capvend/verbatim":"` + s.nonce + `"},"content":[{"type":"text","text":"{\"content\":[]}"}]}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	f.Fuzz(func(t *testing.T, msg []byte) {
		out := s.rewrite(msg)
		if !bytes.Contains(msg, []byte(s.nonce)) && !bytes.Equal(out, msg) {
			t.Fatalf("changed a foreign message")
		}
		if json.Valid(msg) && !json.Valid(out) {
			t.Fatalf("invalid output %q from %q", out, msg)
		}
	})
}

func TestToWireNoLeak(t *testing.T) {
	secret := "preimage=cafebabe /etc/capvend/nsec"
	for _, err := range []error{
		vend.ErrPaymentExpired, vend.ErrPaymentFailed, vend.ErrNoPaymentMethod, vend.ErrLimit,
		vend.ErrUpstream, vend.ErrUnknownTool, errors.New("x"),
	} {
		w := toWire(errors.Join(errors.New(secret), err), "t")
		b, _ := json.Marshal(w)
		if bytes.Contains(b, []byte("cafebabe")) || bytes.Contains(b, []byte("/etc")) {
			t.Errorf("%v leaks: %s", err, b)
		}
	}
}
