package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/mcpprobe"
	"github.com/capvend/capvend/internal/procstat"
)

// flood sends priced calls it never pays for: fresh Nostr keys, and fresh
// MCP HTTP sessions from several loopback addresses.
type flood struct {
	o  *options
	tg *target

	nostrSent, nostrErrs, httpSent atomic.Int64

	pid int // the flood child's, once started

	outcomes mcpprobe.Tally // HTTP answers by kind

	mu     sync.Mutex
	cpu    int64 // the child's CPU ticks, once it was waited for
	exited bool
}

// childCPU is the flood child's CPU ticks once it has been waited for.
func (f *flood) childCPU() (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cpu, f.exited
}

func (f *flood) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); f.nostr(ctx) }()
	go func() { defer wg.Done(); f.http(ctx) }()
	wg.Wait()
}

// nostr publishes keys x calls tools/call events, each key fresh, over
// o.workers relay connections.
func (f *flood) nostr(ctx context.Context) {
	keys := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < f.o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := nostr.RelayConnect(ctx, f.tg.relay)
			if err != nil {
				f.nostrErrs.Add(1)
				for range keys {
				}
				return
			}
			defer r.Close()
			for k := range keys {
				sk := nostr.GeneratePrivateKey()
				for i := 0; i < f.o.calls; i++ {
					body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
						"params": map[string]any{"name": f.o.tool, "arguments": map[string]any{"text": fmt.Sprintf("spam %d/%d", k, i)}}})
					ev := nostr.Event{Kind: 25910, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", f.tg.serverPK}}, Content: string(body)}
					ev.Sign(sk)
					pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					err := r.Publish(pctx, ev)
					cancel()
					if err != nil {
						f.nostrErrs.Add(1)
					}
					f.nostrSent.Add(1)
				}
			}
		}()
	}
	for k := 0; k < f.o.keys && ctx.Err() == nil; k++ {
		keys <- k
	}
	close(keys)
	wg.Wait()
}

// http opens sessions x calls priced calls from 127.0.0.2 .. 127.0.0.(1+sources),
// reading each answer only until its payment_required (or an error), then
// dropping the connection.
func (f *flood) http(ctx context.Context) {
	sessions := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < f.o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range sessions {
				src := fmt.Sprintf("127.0.0.%d", 2+s%max(f.o.sources, 1))
				c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
					DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext,
					DisableKeepAlives: true,
				}}
				f.session(ctx, c, s)
				c.CloseIdleConnections()
			}
		}()
	}
	for s := 0; s < f.o.sessions && ctx.Err() == nil; s++ {
		sessions <- s
	}
	close(sessions)
	wg.Wait()
}

func (f *flood) session(ctx context.Context, c *http.Client, s int) {
	caps := `{"experimental":{"capvend/payments":{}}}`
	if f.o.stock {
		caps = `{}` // a stock host: payment-required tool results
	}
	sid, kind := mcpprobe.Post(ctx, c, f.tg.mcpURL, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":`+caps+`,"clientInfo":{"name":"flood","version":"1"}}}`)
	if sid == "" {
		f.outcomes.Add("initialize: " + kind)
		return
	}
	mcpprobe.Post(ctx, c, f.tg.mcpURL, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	for i := 0; i < f.o.calls && ctx.Err() == nil; i++ {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{"text":"http spam %d/%d"}}}`, i+1, f.o.tool, s, i)
		_, kind := mcpprobe.Post(ctx, c, f.tg.mcpURL, sid, body)
		f.outcomes.Add(kind)
		f.httpSent.Add(1)
	}
}

// The flood runs in a child process (this command with -flood-child), at
// the niceness of -nice: a flood comes from other machines, whose CPU the
// shop does not share, and on a two-core test machine the generator's
// own signing and sending would otherwise take a fifth of it from
// capvend, its relay and the LND nodes. It reports its counts on stdout,
// one JSON line at a time (floodReport).

// floodReport is what the flood child says of its progress.
type floodReport struct {
	Nostr, NostrErrs, HTTP int64
	Outcomes               map[string]int `json:",omitempty"` // with Done
	Done                   bool           `json:",omitempty"`
}

// runChild is the flood child: it floods, reporting every 200 ms and
// once more when done.
func runChild(ctx context.Context, o *options) error {
	tg, err := readTarget(o.config)
	if err != nil {
		return err
	}
	f := &flood{o: o, tg: tg}
	enc := json.NewEncoder(os.Stdout)
	report := func(done bool) {
		r := floodReport{Nostr: f.nostrSent.Load(), NostrErrs: f.nostrErrs.Load(), HTTP: f.httpSent.Load(), Done: done}
		if done {
			r.Outcomes = f.outcomes.Counts()
		}
		enc.Encode(r)
	}
	done := make(chan struct{})
	go func() { defer close(done); f.run(ctx) }()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			report(true)
			return nil
		case <-t.C:
			report(false)
		}
	}
}

// start runs the flood in a child process at o.nice and returns a
// channel closed when it is done; f's counts follow its reports.
func (f *flood) start(ctx context.Context) (<-chan struct{}, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{self, "-flood-child", "-config", f.o.config, "-tool", f.o.tool,
		"-keys", strconv.Itoa(f.o.keys), "-sessions", strconv.Itoa(f.o.sessions), "-calls", strconv.Itoa(f.o.calls),
		"-sources", strconv.Itoa(f.o.sources), "-workers", strconv.Itoa(f.o.workers)}
	if f.o.stock {
		args = append(args, "-stock")
	}
	if f.o.nice != 0 {
		args = append([]string{"nice", "-n", strconv.Itoa(f.o.nice)}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("the flood child: %w", err)
	}
	f.pid = cmd.Process.Pid
	done := make(chan struct{})
	go func() {
		defer close(done)
		dec := json.NewDecoder(out)
		for {
			var r floodReport
			if dec.Decode(&r) != nil {
				break
			}
			f.nostrSent.Store(r.Nostr)
			f.nostrErrs.Store(r.NostrErrs)
			f.httpSent.Store(r.HTTP)
			if r.Done {
				f.outcomes.Replace(r.Outcomes)
			}
		}
		if err := cmd.Wait(); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "capvend-flood: the flood child:", err)
		}
		if ps := cmd.ProcessState; ps != nil {
			f.mu.Lock()
			f.cpu = int64((ps.UserTime() + ps.SystemTime()) * procstat.ClockTicks / time.Second)
			f.exited = true
			f.mu.Unlock()
		}
	}()
	return done, nil
}
