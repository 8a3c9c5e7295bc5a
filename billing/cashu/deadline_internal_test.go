package cashu

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// A mint that takes a connection and never answers must not hang the
// wallet: gonuts calls it on http.DefaultClient, and openWallet gives the
// mint's host a deadline there. Nothing else on http.DefaultClient gets
// one.
func TestHungMintTimesOut(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) }) // runs before hung.Close
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(600 * time.Millisecond)
		io.WriteString(w, "late but whole")
	}))
	t.Cleanup(slow.Close)

	if http.DefaultClient.Timeout != 0 {
		t.Fatalf("http.DefaultClient.Timeout = %v; the deadline must apply to mints only", http.DefaultClient.Timeout)
	}
	// A short deadline for this test's mint (openWallet keeps a host's
	// deadline once set), and a slow host that is no mint.
	mintDeadlines.cover(200*time.Millisecond, hung.URL)
	done := make(chan error, 1)
	go func() {
		_, err := openWallet(t.TempDir(), []string{hung.URL})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a wallet opened on a mint that never answers")
		}
		t.Logf("openWallet on a hung mint: %v", err)
	case <-time.After(time.Minute): // a hang guard, not a timing assertion
		t.Fatal("openWallet still waits for a mint that never answers")
	}
	if mintDeadlines.limit(mustURL(t, hung.URL+"/v1/keys")) != 200*time.Millisecond {
		t.Fatal("openWallet replaced the mint host's deadline")
	}

	resp, err := http.Get(slow.URL)
	if err != nil {
		t.Fatalf("a host that is no mint got a deadline: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "late but whole" {
		t.Fatalf("body %q, %v", b, err)
	}
}

// The deadline covers the body too, and closing the body releases it.
func TestDeadlineCoversBody(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "head")
		w.(http.Flusher).Flush()
		<-release
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	d := &deadlineTransport{base: http.DefaultTransport, hosts: map[string]time.Duration{}}
	d.cover(200*time.Millisecond, srv.URL)
	c := &http.Client{Transport: d}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("reading a body the mint never ends returned no error")
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
