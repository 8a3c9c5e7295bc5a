package testnet

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"
)

// TestRelayMessageLimit: the stack's relay with a message limit (as
// `capvend testnet relay --max-message-length 65536` runs it) advertises
// the limit in NIP-11, takes an event under it, and closes the connection
// of a client sending a larger one, as public relays do.
func TestRelayMessageLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunRelay(ctx, addr, 64<<10, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunRelay: %v", err)
		}
	})
	url := "ws://" + addr
	var info nip11.RelayInformationDocument
	for i := 0; ; i++ { // until it listens: a deadlock guard, not a speed check
		info, err = nip11.Fetch(context.Background(), url)
		if err == nil || i == 100 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || info.Limitation == nil || info.Limitation.MaxMessageLength != 64<<10 {
		t.Fatalf("NIP-11 %+v (limitation %+v): %v", info, info.Limitation, err)
	}

	// A raw websocket, as a relay's client: go-nostr's Relay races with
	// itself when the connection closes under it.
	conn, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // a deadlock guard
	sk := nostr.GeneratePrivateKey()
	publish := func(n int) ([]byte, error) {
		ev := nostr.Event{Kind: 1, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: strings.Repeat("x", n)}
		ev.Sign(sk)
		b, _ := json.Marshal(nostr.EventEnvelope{Event: ev})
		if err := conn.WriteMessage(websocket.TextMessage, b); err != nil {
			return nil, err
		}
		_, msg, err := conn.ReadMessage()
		return msg, err
	}
	if msg, err := publish(60 << 10); err != nil || !strings.HasPrefix(string(msg), `["OK",`) || !strings.Contains(string(msg), "true") {
		t.Fatalf("an event under the limit: %s %v", msg, err)
	}
	msg, err := publish(65 << 10)
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseMessageTooBig {
		t.Fatalf("an event over the limit: %s %v, want the connection closed (1009)", msg, err)
	}
}
