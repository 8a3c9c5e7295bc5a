package cashu_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/vend"
)

// BenchmarkQuotes measures mint quotes per second: capvend's Request (mint
// quote + ledger record) next to gonuts' raw wallet.RequestMint and a raw
// HTTP POST /v1/mint/quote/bolt11, sequential and with 8 concurrent
// callers. Each quote is an invoice on the mint's LND node.
func BenchmarkQuotes(b *testing.B) {
	needStack(b)
	ctx := context.Background()
	for _, par := range []int{1, 8} {
		b.Run(fmt.Sprintf("Request/par=%d", par), func(b *testing.B) {
			l := openLedger(b)
			be := newBackend(b, l, stack.MintURL, b.TempDir())
			defer be.Close()
			calls := make([]vend.Call, b.N)
			for i := range calls {
				calls[i] = priced(b, l, 10)
			}
			runPar(b, par, func(i int) error {
				_, err := be.Request(ctx, vend.PaymentRequest{CallID: calls[i].ID, Amount: calls[i].Price, Expiry: time.Minute})
				return err
			})
		})
		b.Run(fmt.Sprintf("RawWalletRequestMint/par=%d", par), func(b *testing.B) {
			w, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(b.TempDir(), "w"), CurrentMintURL: stack.MintURL})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Shutdown()
			runPar(b, par, func(int) error {
				_, err := w.RequestMint(10, stack.MintURL)
				return err
			})
		})
		b.Run(fmt.Sprintf("RawHTTP/par=%d", par), func(b *testing.B) {
			body, _ := json.Marshal(nut04.PostMintQuoteBolt11Request{Amount: 10, Unit: "sat"})
			runPar(b, par, func(int) error {
				resp, err := http.Post(stack.MintURL+"/v1/mint/quote/bolt11", "application/json", bytes.NewReader(body))
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				var q nut04.PostMintQuoteBolt11Response
				if err := json.NewDecoder(resp.Body).Decode(&q); err != nil || q.Quote == "" {
					return fmt.Errorf("quote: %v (HTTP %d)", err, resp.StatusCode)
				}
				return nil
			})
		})
	}
}

// runPar runs f for i in [0, b.N) on par goroutines and reports quotes/s.
func runPar(b *testing.B, par int, f func(i int) error) {
	b.Helper()
	work := make(chan int)
	errs := make(chan error, par)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < b.N; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "quotes/s")
}

// BenchmarkSettlementLatency measures, per paid quote (polling at the
// default 250 ms and at 50 ms, and with NUT-17 subscriptions unless
// -cashu.nut17=false), the time from the
// customer's payment succeeding (Pay returns) to capvend's report callback
// firing (the quote minted and the settlement recorded), next to the raw
// figure measured on the same quote in the same run: a tight 5 ms poll of
// the mint's quote state (GET /v1/mint/quote/bolt11/ID) until PAID, i.e.
// when the mint itself knows. Figures are p50/p99 in milliseconds; a
// negative latency (detected before Pay returned) counts as 0. Run with
// -benchtime=Nx (each iteration is one Lightning payment).
func BenchmarkSettlementLatency(b *testing.B) {
	needStack(b)
	b.Run("poll=250ms", func(b *testing.B) { benchLatency(b, 250*time.Millisecond, false) })
	b.Run("poll=50ms", func(b *testing.B) { benchLatency(b, 50*time.Millisecond, false) })
	if *nut17 {
		b.Run("nut17+poll=250ms", func(b *testing.B) { benchLatency(b, 250*time.Millisecond, true) })
	}
}

func benchLatency(b *testing.B, poll time.Duration, ws bool) {
	ctx := context.Background()
	l := openLedger(b)
	be, err := cashu.New(cashu.Config{
		Mints: []string{stack.MintURL}, WalletDir: filepath.Join(b.TempDir(), "wallet"),
		MintQuotes: true, PollInterval: poll, Websocket: ws, Log: testLogger(b),
	}, l)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	settled := map[string]chan time.Time{}
	waiter := func(ref string) chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		ch, ok := settled[ref]
		if !ok {
			ch = make(chan time.Time, 1)
			settled[ref] = ch
		}
		return ch
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- be.Run(rctx, func(e vend.PaymentEvent) {
			if e.Payment.State == vend.PaymentSettled {
				waiter(e.Payment.Ref) <- time.Now()
			}
		})
	}()
	defer func() { cancel(); <-done }()
	calls := make([]vend.Call, b.N)
	for i := range calls {
		calls[i] = priced(b, l, 3)
	}
	var ours, raw []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, err := be.Request(ctx, vend.PaymentRequest{CallID: calls[i].ID, Amount: calls[i].Price, Expiry: 5 * time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		rawSeen := make(chan time.Time, 1)
		pctx, pcancel := context.WithCancel(ctx)
		go func() {
			for pctx.Err() == nil {
				if st, err := rawState(pctx, p.Ref); err == nil && (st == nut04.Paid || st == nut04.Issued) {
					rawSeen <- time.Now()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		if _, err := stack.Pay(ctx, p.Bolt11); err != nil {
			b.Fatal(err)
		}
		paid := time.Now()
		select {
		case t := <-waiter(p.Ref):
			ours = append(ours, max(0, t.Sub(paid)))
		case <-time.After(60 * time.Second):
			b.Fatalf("payment %s not reported settled", p.Ref)
		}
		select {
		case t := <-rawSeen:
			raw = append(raw, max(0, t.Sub(paid)))
		case <-time.After(10 * time.Second):
		}
		pcancel()
	}
	b.StopTimer()
	report(b, ours, "capvend")
	report(b, raw, "raw-mint-poll")
}

func rawState(ctx context.Context, id string) (nut04.State, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, stack.MintURL+"/v1/mint/quote/bolt11/"+id, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var q nut04.PostMintQuoteBolt11Response
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil {
		return 0, err
	}
	return q.State, nil
}

func report(b *testing.B, ds []time.Duration, name string) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	pct := func(p float64) float64 {
		i := int(p * float64(len(ds)-1))
		return float64(ds[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), name+"-p50-ms")
	b.ReportMetric(pct(0.99), name+"-p99-ms")
}
