package cli

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit"
)

// `serve` says "serving ContextVM" only once its subscription is ready:
// a request published right after the line is answered, although the
// relay takes 2 s to take the server's subscription (khatru refuses an
// ephemeral request nobody listens for). A relay that cannot be reached
// is named, and the line counts the relays subscribed; /readyz counts the
// Nostr front ready (one relay subscribed).
func TestServingLineMeansSubscribed(t *testing.T) {
	t.Parallel()
	rl := testkit.NewRelay()
	sk := nostr.GeneratePrivateKey()
	server, _ := nostr.GetPublicKey(sk)
	rl.RejectFilter = append(rl.RejectFilter, func(_ context.Context, f nostr.Filter) (bool, string) {
		if p := f.Tags["p"]; len(p) == 1 && p[0] == server {
			time.Sleep(2 * time.Second) // the server's subscription, not the client's
		}
		return false, ""
	})
	relay := testkit.ServeRelay(t, rl)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port nothing answers on once closed
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String()
	ln.Close()

	path, _ := capvendtest.NostrToolsConfig(t, relay+", "+dead, sk, "")
	admin := capvendtest.AdminConfig(t, path, "")
	sv := startCapvend(t, path)
	c := newLoadClient(t, relay, server)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard
	defer cancel()
	if _, err := c.call(ctx, "ping", `{}`); err != nil {
		t.Fatalf("a request right after %q: %v", sv.Stderr(), err)
	}
	if code, body := capvendtest.Get(t, "http://"+admin+"/readyz", ""); code != http.StatusOK || !strings.Contains(body, "ok: nostr") {
		t.Errorf("readyz once subscribed on one relay of two: %d\n%s", code, body)
	}
	out := sv.Stderr()
	if !strings.Contains(out, "capvend: nostr relay "+dead+": not subscribed: ") {
		t.Errorf("the dead relay is not named: %s", out)
	}
	if !strings.Contains(out, "on 1 of 2 relay(s)") {
		t.Errorf("the serving line does not count the relays subscribed: %s", out)
	}
	if i, j := strings.Index(out, "nostr relay "+dead), strings.Index(out, "serving ContextVM"); i > j {
		t.Errorf("the dead relay is named after the serving line: %s", out)
	}
}
