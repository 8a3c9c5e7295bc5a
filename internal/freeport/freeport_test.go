package freeport

import (
	"net"
	"strconv"
	"testing"
)

// The ports are distinct, below the ephemeral range (where outgoing
// connections cannot take them), and free to bind.
func TestPortsBelowTheEphemeralRange(t *testing.T) {
	ps, err := Ports(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	high := ephemeralLow()
	for _, p := range ps {
		if seen[p] {
			t.Fatalf("port %d picked twice", p)
		}
		seen[p] = true
		if high-low >= 1000 && (p < low || p >= high) {
			t.Fatalf("port %d is outside [%d, %d)", p, low, high)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}
