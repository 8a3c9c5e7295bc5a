package cashu

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// MintCallTimeout bounds each HTTP call gonuts' wallet makes to a mint
// capvend loaded a wallet for, body included.
const MintCallTimeout = 30 * time.Second

// gonuts' wallet calls the mint with http.Get and http.Post, that is on
// http.DefaultClient, which has no timeout: a hung mint would hang the
// wallet's caller forever. Rather than give every user of
// http.DefaultClient in the process a timeout, its transport is wrapped
// (at package init, before any goroutine can use it) by mintDeadlines,
// which passes every request through unchanged except those to the hosts
// of mints a wallet was opened for (openWallet adds them).
var mintDeadlines = &deadlineTransport{hosts: map[string]time.Duration{}}

func init() {
	base := http.DefaultClient.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	mintDeadlines.base = base
	http.DefaultClient.Transport = mintDeadlines
}

// deadlineTransport gives requests to some hosts a deadline.
type deadlineTransport struct {
	base  http.RoundTripper
	mu    sync.RWMutex
	hosts map[string]time.Duration // scheme://host[:port] -> deadline
}

// cover makes requests to the hosts of urls time out after limit. A host
// already covered keeps its deadline.
func (d *deadlineTransport) cover(limit time.Duration, urls ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range urls {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			continue
		}
		if _, ok := d.hosts[u.Scheme+"://"+u.Host]; !ok {
			d.hosts[u.Scheme+"://"+u.Host] = limit
		}
	}
}

// limit is the deadline of requests to u's host; 0 means none.
func (d *deadlineTransport) limit(u *url.URL) time.Duration {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.hosts[u.Scheme+"://"+u.Host]
}

// RoundTrip sends r, with a deadline that runs until the response's body
// is closed if r goes to a covered host.
func (d *deadlineTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	limit := d.limit(r.URL)
	if limit == 0 {
		return d.base.RoundTrip(r)
	}
	ctx, cancel := context.WithTimeout(r.Context(), limit)
	resp, err := d.base.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose releases a request's deadline when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
