// Package freeport picks TCP ports on 127.0.0.1 for servers that are
// started after the pick: the regtest stack's processes, PostgreSQL, and
// the capvend instances tests start.
//
// A port the kernel hands out for port 0 comes from the ephemeral range
// (ip_local_port_range, 32768-60999 by default), the same range it takes
// the local ports of outgoing connections from: between the pick and the
// server's bind, any connection the machine opens (to LND, PostgreSQL, a
// relay...) may take it, and the server fails with "address already in
// use". Ports picked here lie below that range, where only servers bind.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// low is the first port picked; the range ends below the ephemeral one.
const low = 10000

// Ports returns n distinct ports on 127.0.0.1 that were free when picked
// (each was bound, then released for its server to bind).
func Ports(n int) ([]int, error) {
	high := ephemeralLow()
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for len(ports) < n {
		l, err := pick(high)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Addr returns one free 127.0.0.1:port (see Ports).
func Addr() (string, error) {
	p, err := Ports(1)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p[0]), nil
}

// pick binds a random port in [low, high), or, if that range is too
// small or full, one the kernel chooses.
func pick(high int) (net.Listener, error) {
	for try := 0; try < 64 && high-low >= 1000; try++ {
		p := low + rand.IntN(high-low)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			return l, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("freeport: %w", err)
	}
	return l, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
