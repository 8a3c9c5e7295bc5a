package testnet

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// btcdRPC is a minimal JSON-RPC client for btcd: the handful of calls the
// stack needs (getblockcount, generate, getrawmempool) do not justify
// btcd's rpcclient and its websocket machinery.
type btcdRPC struct {
	url, user, pass string
	hc              *http.Client
	id              atomic.Int64
}

func newBtcdRPC(host, user, pass, certPath string) (*btcdRPC, error) {
	pem, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", certPath)
	}
	return &btcdRPC{
		url:  "https://" + host,
		user: user,
		pass: pass,
		hc: &http.Client{
			Timeout:   5 * time.Minute, // generate of hundreds of blocks
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		},
	}, nil
}

// rpcError is an error object returned by btcd.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("btcd rpc error %d: %s", e.Code, e.Message) }

func (c *btcdRPC) call(ctx context.Context, method string, params []any, result any) error {
	if params == nil {
		params = []any{}
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "1.0", "id": c.id.Add(1), "method": method, "params": params})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.SetBasicAuth(c.user, c.pass)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("btcd %s: %w", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("btcd %s: %w", method, err)
	}
	var r struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("btcd %s: http %d: %s", method, resp.StatusCode, tail(string(b), 200))
	}
	if r.Error != nil {
		return fmt.Errorf("btcd %s: %w", method, r.Error)
	}
	if result != nil {
		return json.Unmarshal(r.Result, result)
	}
	return nil
}

func (c *btcdRPC) blockCount(ctx context.Context) (int64, error) {
	var n int64
	err := c.call(ctx, "getblockcount", nil, &n)
	return n, err
}

func (c *btcdRPC) generate(ctx context.Context, n int) ([]string, error) {
	var hashes []string
	err := c.call(ctx, "generate", []any{n}, &hashes)
	return hashes, err
}

func (c *btcdRPC) mempool(ctx context.Context) ([]string, error) {
	var txids []string
	err := c.call(ctx, "getrawmempool", nil, &txids)
	return txids, err
}
