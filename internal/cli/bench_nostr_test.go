package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/internal/testkit"
)

// nostrBenchInFlight is how many calls the load client keeps in flight.
const nostrBenchInFlight = 16

// BenchmarkNostrFreeCall measures free tools/call throughput and latency
// over ContextVM through one local relay: capvend (`serve` in-process,
// its Nostr front selling example-tools' word_count, free, over stdio)
// against the stock @contextvm/sdk server (testdata/contextvm/server.mjs,
// node) wrapping the same tool, on the same relay, in the same run, driven
// by the same Go load client (plaintext requests, nostrBenchInFlight in
// flight, one client key). Sub-benchmarks: sdk and capvend, one after the
// other (capvend's line has the ratio x_sdk), and interleaved, both in
// alternating rounds (steadier on a busy machine). Target: capvend >= 5x
// the SDK's calls/s.
//
//	go test -run '^$' -bench NostrFreeCall -benchtime 10s ./internal/cli
//
// Needs node and `npm ci` in internal/cli/testdata/contextvm (else skipped).
func BenchmarkNostrFreeCall(b *testing.B) {
	if missing, install := npmMissing("contextvm"); missing != "" {
		skip.Missing(b, "stock ContextVM server: "+missing, install)
	}
	relay := testkit.Relay(b)

	sk := nostr.GeneratePrivateKey()
	ours, _ := nostr.GetPublicKey(sk)
	path, _ := capvendtest.NostrToolsConfig(b, relay, sk, "")
	startCapvend(b, path)
	theirs, _ := startSDKServer(b, "server.mjs", relay)

	sdk, cv := newLoadClient(b, relay, theirs), newLoadClient(b, relay, ours)
	sdk.warmUp(b)
	cv.warmUp(b)

	results := map[string]loadResult{}
	// The SDK first: capvend's line then carries the ratio (x_sdk).
	for _, target := range []struct {
		name string
		c    *loadClient
	}{{"sdk", sdk}, {"capvend", cv}} {
		b.Run(target.name, func(b *testing.B) {
			b.ResetTimer()
			r := target.c.load(b, b.N).result()
			b.StopTimer()
			b.ReportMetric(r.perSecond, "calls/s")
			b.ReportMetric(capvendtest.Ms(r.p50), "p50-ms")
			b.ReportMetric(capvendtest.Ms(r.p99), "p99-ms")
			if s := results["sdk"]; target.name == "capvend" && s.perSecond > 0 {
				b.ReportMetric(r.perSecond/s.perSecond, "x_sdk")
			}
			results[target.name] = r
		})
	}
	if o, s := results["capvend"], results["sdk"]; o.perSecond > 0 && s.perSecond > 0 {
		b.Logf("capvend %.0f calls/s (p50 %v, p99 %v); stock SDK server %.0f calls/s (p50 %v, p99 %v); throughput %.1fx",
			o.perSecond, o.p50, o.p99, s.perSecond, s.p50, s.p99, o.perSecond/s.perSecond)
	}

	// Both in alternating rounds, so that a busy machine slows both alike:
	// the steadier ratio. An op is one call to each.
	b.Run("interleaved", func(b *testing.B) {
		var ts, to tally
		b.ResetTimer()
		for done := 0; done < b.N; {
			n := min(nostrBenchRound, b.N-done)
			ts.add(sdk.load(b, n))
			to.add(cv.load(b, n))
			done += n
		}
		b.StopTimer()
		s, o := ts.result(), to.result()
		b.ReportMetric(o.perSecond, "capvend-calls/s")
		b.ReportMetric(s.perSecond, "sdk-calls/s")
		b.ReportMetric(capvendtest.Ms(o.p50), "capvend-p50-ms")
		b.ReportMetric(capvendtest.Ms(s.p50), "sdk-p50-ms")
		b.ReportMetric(capvendtest.Ms(o.p99), "capvend-p99-ms")
		b.ReportMetric(capvendtest.Ms(s.p99), "sdk-p99-ms")
		b.ReportMetric(o.perSecond/s.perSecond, "x_sdk")
	})
}

// nostrBenchRound is how many calls each server gets in a turn of the
// interleaved benchmark.
const nostrBenchRound = 200

// startSDKServer runs script, a stock server of testdata/contextvm, on
// relay until the test ends, and returns its pubkey, once it is
// subscribed, and the node process's pid.
func startSDKServer(tb testing.TB, script, relay string) (pubkey string, pid int) {
	tb.Helper()
	cmd := exec.Command("node", script, relay, "optional")
	cmd.Dir = needNPM(tb, "contextvm")
	cmd.Env = append(os.Environ(), "CONTEXTVM_SERVER_KEY="+nostr.GeneratePrivateKey())
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	tb.Cleanup(func() {
		stdin.Close() // the server exits when stdin closes
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if pk, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- pk
			}
		}
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(exited)
	}()
	select {
	case pk := <-ready:
		return pk, cmd.Process.Pid
	case <-exited:
		tb.Fatalf("stock ContextVM server exited: %s", stderr.String())
	case <-time.After(60 * time.Second): // a hang guard
		tb.Fatalf("stock ContextVM server not ready: %s", stderr.String())
	}
	return "", 0
}

// loadClient is the shared ContextVM client (internal/ctxvmclient) for
// load: plaintext, one relay connection, one key, answers matched to
// requests by their e tag. It measures the servers, not itself: it does
// not check their signatures (AssumeValid).
type loadClient struct {
	*ctxvmclient.Client
}

func newLoadClient(tb testing.TB, url, server string) *loadClient {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a deadlock guard
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, url, server, ctxvmclient.Options{Kinds: []int{ctxvmclient.KindMessage}, AssumeValid: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return &loadClient{c}
}

// call sends one request (method and params JSON) and returns the content
// of its response (notifications about it are skipped).
func (c *loadClient) call(ctx context.Context, method, params string) (string, error) {
	_, r, err := c.Request(ctx, method, json.RawMessage(params), ctxvmclient.Request{})
	if err != nil {
		return "", err
	}
	return r.Event.Content, nil
}

// wordCountArgs and wordCountAnswer are the benchmark's call and what
// both servers answer.
const (
	wordCountArgs   = `{"name":"word_count","arguments":{"text":"the quick brown fox"}}`
	wordCountAnswer = `4 words, 1 lines, 19 characters`
)

// warmUp initializes like a stock client and calls word_count until it
// answers (capvend's upstream may still be connecting).
func (c *loadClient) warmUp(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	// serve says "serving ContextVM" once subscribed (see
	// TestServingLineMeansSubscribed); the retry guards a relay that
	// refuses a request nobody listens for yet all the same.
	for {
		_, err := c.call(ctx, "initialize", `{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}`)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "no one was listening") || ctx.Err() != nil {
			tb.Fatalf("initialize: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	n, err := c.Event(ctxvmclient.KindMessage, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.Publish(ctx, n); err != nil {
		tb.Fatal(err)
	}
	last := ""
	for ok := 0; ok < 50; {
		out, err := c.call(ctx, "tools/call", wordCountArgs)
		if err != nil {
			tb.Fatalf("word_count never answered; last answer %s: %v", last, err)
		}
		if strings.Contains(out, wordCountAnswer) {
			ok++
			continue
		}
		last = out
		time.Sleep(100 * time.Millisecond)
	}
}

type loadResult struct {
	perSecond float64
	p50, p99  time.Duration
}

// tally is the time taken by calls made together and each one's latency.
type tally struct {
	elapsed time.Duration
	lat     []time.Duration
}

func (t *tally) add(u tally) {
	t.elapsed += u.elapsed
	t.lat = append(t.lat, u.lat...)
}

func (t tally) result() loadResult {
	n := len(t.lat)
	if n == 0 {
		return loadResult{}
	}
	slices.Sort(t.lat)
	return loadResult{perSecond: float64(n) / t.elapsed.Seconds(), p50: t.lat[n/2], p99: t.lat[n*99/100]}
}

// load makes n word_count calls, nostrBenchInFlight at a time; a failed
// or wrong answer fails the benchmark.
func (c *loadClient) load(b *testing.B, n int) tally {
	return c.loadInFlight(b, n, nostrBenchInFlight)
}

// loadInFlight is load with inFlight calls at a time.
func (c *loadClient) loadInFlight(b *testing.B, n, inFlight int) tally {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a hang guard
	defer cancel()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range min(inFlight, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || firstErr.Load() != nil {
					return
				}
				t0 := time.Now()
				out, err := c.call(ctx, "tools/call", wordCountArgs)
				lat[i] = time.Since(t0)
				if err == nil && !strings.Contains(out, wordCountAnswer) {
					err = errors.New("answer " + out)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := firstErr.Load(); err != nil {
		b.Fatal(*err)
	}
	return tally{elapsed: elapsed, lat: lat}
}
