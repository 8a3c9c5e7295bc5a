package nwc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip04"
	"github.com/nbd-wtf/go-nostr/nip44"
)

// The event kinds of NIP-47.
const (
	KindInfo              = 13194 // the wallet's replaceable info event: methods, encryption, notifications
	KindRequest           = 23194 // a request to the wallet
	KindResponse          = 23195 // its answer
	KindNotificationNIP04 = 23196 // a notification, NIP-04 encrypted
	KindNotification      = 23197 // a notification, NIP-44 encrypted
)

// Encryption is how the requests and answers of a connection are encrypted.
type Encryption string

// The encryptions of NIP-47: NIP-44 (v2) where the wallet offers it, else
// NIP-04 (a wallet whose info event names none speaks only NIP-04).
const (
	NIP44 Encryption = "nip44_v2"
	NIP04 Encryption = "nip04"
)

// The NIP-47 methods and notifications capvend uses.
const (
	MethodGetInfo           = "get_info"
	MethodMakeInvoice       = "make_invoice"
	MethodLookupInvoice     = "lookup_invoice"
	MethodListTransactions  = "list_transactions"
	MethodPayInvoice        = "pay_invoice"
	MethodMakeHoldInvoice   = "make_hold_invoice"
	MethodSettleHoldInvoice = "settle_hold_invoice"
	MethodCancelHoldInvoice = "cancel_hold_invoice"

	NotePaymentReceived     = "payment_received"
	NoteHoldInvoiceAccepted = "hold_invoice_accepted"
)

// WalletInfo is what a connection may do: the wallet's info event and its
// get_info answer.
type WalletInfo struct {
	Encryption    Encryption
	Methods       []string // what get_info says this connection may call
	Notifications []string // the notifications it will be sent
	Alias         string
	Network       string
}

// Can reports whether the connection may call method.
func (w WalletInfo) Can(method string) bool { return slices.Contains(w.Methods, method) }

// Notifies reports whether the connection is sent notification n.
func (w WalletInfo) Notifies(n string) bool { return slices.Contains(w.Notifications, n) }

// Transaction is NIP-47's transaction object (make_invoice, lookup_invoice,
// list_transactions and the notifications). Amounts are msat, times unix
// seconds.
type Transaction struct {
	Type           string `json:"type"`            // incoming, outgoing
	State          string `json:"state,omitempty"` // pending, settled, expired, failed, accepted (a held hold invoice)
	Invoice        string `json:"invoice,omitempty"`
	Description    string `json:"description,omitempty"`
	PaymentHash    string `json:"payment_hash"`
	Amount         int64  `json:"amount"`
	FeesPaid       int64  `json:"fees_paid,omitempty"`
	Preimage       string `json:"preimage,omitempty"` // a settled one's (a secret of an incoming one: never log it)
	CreatedAt      int64  `json:"created_at,omitempty"`
	ExpiresAt      int64  `json:"expires_at,omitempty"`
	SettledAt      int64  `json:"settled_at,omitempty"`
	SettleDeadline int64  `json:"settle_deadline,omitempty"`
}

// Notification is one notification the wallet sent.
type Notification struct {
	Type string      // payment_received, hold_invoice_accepted, ...
	Tx   Transaction // its transaction
}

// ClientConfig tunes a Client.
type ClientConfig struct {
	// Timeout bounds one request: publishing it and the wallet's
	// answer (default 30 s). The request carries a NIP-40 expiration at
	// that time, so a wallet that sees it later ignores it.
	Timeout time.Duration
	// ConnectTimeout bounds connecting to the relay and reading the
	// wallet's info event (default 10 s).
	ConnectTimeout time.Duration
}

// Client speaks NIP-47 to one wallet over its relay. Connect opens a
// session; requests go over the current session, and fail with
// ErrUnreachable while there is none. It is safe for concurrent use.
type Client struct {
	uri       URI
	cfg       ClientConfig
	clientPub string
	conv44    [32]byte
	shared04  []byte

	mu   sync.Mutex
	sess *Session
	info WalletInfo // known once a session read it
}

// NewClient returns a client of the connection u; it connects nothing.
func NewClient(u URI, cfg ClientConfig) (*Client, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	c := &Client{uri: u, cfg: cfg, clientPub: u.ClientPubkey()}
	var err error
	if c.conv44, err = nip44.GenerateConversationKey(u.Wallet, u.Secret); err != nil {
		return nil, fmt.Errorf("%w: the wallet's public key is not a valid key", ErrBadURI)
	}
	if c.shared04, err = nip04.ComputeSharedSecret(u.Wallet, u.Secret); err != nil {
		return nil, fmt.Errorf("%w: the wallet's public key is not a valid key", ErrBadURI)
	}
	return c, nil
}

// URI returns the connection's URI (String hides its secret).
func (c *Client) URI() URI { return c.uri }

// Info returns what the last session learned of the wallet (zero before
// the first).
func (c *Client) Info() WalletInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.info
}

// Session is one connection to the wallet's relay: requests and their
// answers, and the notifications received, until the connection ends.
type Session struct {
	c     *Client
	relay *nostr.Relay
	enc   Encryption
	done  chan struct{} // closed when the connection ended
	cause error         // why, set before done closes

	mu      sync.Mutex
	pending map[string]chan response // by request event id
	notes   []Notification
	noteC   chan struct{} // a notification was queued (capacity 1)
	wg      sync.WaitGroup
}

type response struct {
	ResultType string          `json:"result_type"`
	Error      *walletErrJSON  `json:"error"`
	Result     json.RawMessage `json:"result"`
}

type walletErrJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Connect opens a session on the first of the URI's relays that answers:
// it reads the wallet's info event (choosing the encryption), subscribes
// to answers and notifications, and asks get_info what the connection may
// do. The session becomes the client's current one; the previous one is
// closed. The session ends when its relay connection breaks (Done) or
// Close is called.
func (c *Client) Connect(ctx context.Context) (*Session, error) {
	var errs []error
	for _, url := range c.uri.Relays {
		s, err := c.connect(ctx, url)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func (c *Client) connect(ctx context.Context, url string) (*Session, error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	relay := nostr.NewRelay(context.Background(), url, nostr.WithNoticeHandler(func(string) {}))
	if err := relay.Connect(cctx); err != nil {
		return nil, fmt.Errorf("%w: relay %s: %v", ErrUnreachable, url, err)
	}
	fail := func(err error) (*Session, error) {
		relay.Close()
		return nil, err
	}
	infos, err := relay.QuerySync(cctx, nostr.Filter{Kinds: []int{KindInfo}, Authors: []string{c.uri.Wallet}, Limit: 1})
	if err != nil {
		return fail(fmt.Errorf("%w: relay %s: reading the wallet's info event: %v", ErrUnreachable, url, err))
	}
	if len(infos) == 0 {
		return fail(fmt.Errorf("%w on relay %s", ErrNoInfo, url))
	}
	info := infoEvent(infos[0])
	s := &Session{c: c, relay: relay, enc: info.Encryption, done: make(chan struct{}),
		pending: map[string]chan response{}, noteC: make(chan struct{}, 1)}
	kinds := []int{KindResponse, KindNotification}
	if s.enc == NIP04 {
		kinds = []int{KindResponse, KindNotificationNIP04}
	}
	since := nostr.Timestamp(time.Now().Add(-time.Minute).Unix())
	sub, err := relay.Subscribe(context.Background(), nostr.Filters{{Kinds: kinds, Authors: []string{c.uri.Wallet},
		Tags: nostr.TagMap{"p": {c.clientPub}}, Since: &since}})
	if err != nil {
		return fail(fmt.Errorf("%w: relay %s: subscribing: %v", ErrUnreachable, url, err))
	}
	s.wg.Add(1)
	go s.read(sub)
	var gi struct {
		Alias         string   `json:"alias"`
		Network       string   `json:"network"`
		Methods       []string `json:"methods"`
		Notifications []string `json:"notifications"`
	}
	if err := s.Do(ctx, MethodGetInfo, struct{}{}, &gi); err != nil {
		s.Close()
		return nil, fmt.Errorf("nwc: get_info: %w", err)
	}
	info.Alias, info.Network = gi.Alias, gi.Network
	if len(gi.Methods) > 0 {
		info.Methods = gi.Methods // the connection's grant, narrower than the wallet's
	}
	if gi.Notifications != nil {
		info.Notifications = gi.Notifications
	}
	c.mu.Lock()
	old := c.sess
	c.sess, c.info = s, info
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return s, nil
}

// infoEvent reads the wallet's info event: the methods (content), the
// encryptions (NIP-44 preferred) and the notifications it offers.
func infoEvent(ev *nostr.Event) WalletInfo {
	w := WalletInfo{Encryption: NIP04, Methods: strings.Fields(ev.Content)}
	if t := ev.Tags.Find("encryption"); len(t) > 1 && slices.Contains(strings.Fields(t[1]), string(NIP44)) {
		w.Encryption = NIP44
	}
	if t := ev.Tags.Find("notifications"); len(t) > 1 {
		w.Notifications = strings.Fields(t[1])
	}
	return w
}

// Current returns the current session, nil when there is none or it
// ended.
func (c *Client) Current() *Session {
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s == nil || s.Ended() {
		return nil
	}
	return s
}

// Do sends one request over the current session (see Session.Do);
// ErrUnreachable when there is none.
func (c *Client) Do(ctx context.Context, method string, params, result any) error {
	return c.doWithin(ctx, c.cfg.Timeout, method, params, result)
}

// doWithin is Do with timeout in place of the client's Timeout (a
// payment may take longer than a lookup).
func (c *Client) doWithin(ctx context.Context, timeout time.Duration, method string, params, result any) error {
	s := c.Current()
	if s == nil {
		return fmt.Errorf("%w: not connected", ErrUnreachable)
	}
	return s.do(ctx, timeout, method, params, result)
}

// Close closes the current session.
func (c *Client) Close() {
	c.mu.Lock()
	s := c.sess
	c.sess = nil
	c.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// Encryption is the session's encryption.
func (s *Session) Encryption() Encryption { return s.enc }

// Done is closed when the session's relay connection ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Ended reports whether Done is closed.
func (s *Session) Ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Err is why the session ended (nil while it runs).
func (s *Session) Err() error {
	if !s.Ended() {
		return nil
	}
	return s.cause
}

// Close ends the session and waits for its reader. Idempotent.
func (s *Session) Close() {
	s.relay.Close()
	s.wg.Wait()
}

// Notifications returns the notifications received since the last call,
// oldest first, and a channel that receives when more arrive.
func (s *Session) Notifications() ([]Notification, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.notes
	s.notes = nil
	return out, s.noteC
}

// read routes the subscription's events until the connection ends: an
// answer to the request waiting for it, a notification to the queue. The
// queue is unbounded, so that answers are never held up behind
// notifications nobody takes yet (Run takes them only after the open
// invoices were looked up).
func (s *Session) read(sub *nostr.Subscription) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		s.cause = fmt.Errorf("%w: relay %s: connection ended", ErrUnreachable, s.relay.URL)
		for id, ch := range s.pending {
			close(ch)
			delete(s.pending, id)
		}
		s.mu.Unlock()
		close(s.done)
	}()
	for {
		select {
		case <-s.relay.Context().Done():
			return
		case reason := <-sub.ClosedReason:
			_ = reason
			s.relay.Close()
			return
		case ev, ok := <-sub.Events:
			if !ok {
				return
			}
			if ev.PubKey != s.c.uri.Wallet {
				continue
			}
			plain, err := s.decrypt(ev.Content)
			if err != nil {
				continue // not for us, or not in this session's encryption
			}
			switch ev.Kind {
			case KindResponse:
				t := ev.Tags.Find("e")
				if len(t) < 2 {
					continue
				}
				var r response
				if json.Unmarshal([]byte(plain), &r) != nil {
					continue
				}
				s.mu.Lock()
				ch := s.pending[t[1]]
				delete(s.pending, t[1])
				s.mu.Unlock()
				if ch != nil {
					ch <- r
				}
			case KindNotification, KindNotificationNIP04:
				var n struct {
					Type string      `json:"notification_type"`
					Tx   Transaction `json:"notification"`
				}
				if json.Unmarshal([]byte(plain), &n) != nil || n.Type == "" {
					continue
				}
				s.mu.Lock()
				s.notes = append(s.notes, Notification{Type: n.Type, Tx: n.Tx})
				s.mu.Unlock()
				select {
				case s.noteC <- struct{}{}:
				default:
				}
			}
		}
	}
}

func (s *Session) encrypt(plain string) (string, error) {
	if s.enc == NIP04 {
		return nip04.Encrypt(plain, s.c.shared04)
	}
	return nip44.Encrypt(plain, s.c.conv44)
}

func (s *Session) decrypt(content string) (string, error) {
	if s.enc == NIP04 || strings.Contains(content, "?iv=") {
		return nip04.Decrypt(content, s.c.shared04)
	}
	return nip44.Decrypt(content, s.c.conv44)
}

// Do sends one request and waits for its answer, at most the client's
// Timeout: the answer's result is decoded into result (if not nil). A
// wallet error is a *WalletError matching the sentinel of its code; no
// answer in time is ErrTimeout; a broken connection ErrUnreachable. A
// request whose answer was lost may have been carried out: callers make
// their requests safe to repeat, or look up what happened.
func (s *Session) Do(ctx context.Context, method string, params, result any) error {
	return s.do(ctx, s.c.cfg.Timeout, method, params, result)
}

func (s *Session) do(ctx context.Context, timeout time.Duration, method string, params, result any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := json.Marshal(struct {
		Method string `json:"method"`
		Params any    `json:"params"`
	}{method, params})
	if err != nil {
		return err
	}
	content, err := s.encrypt(string(body))
	if err != nil {
		return fmt.Errorf("nwc: %s: encrypt: %w", method, err)
	}
	deadline, _ := ctx.Deadline()
	ev := nostr.Event{Kind: KindRequest, CreatedAt: nostr.Now(), Content: content, Tags: nostr.Tags{
		{"p", s.c.uri.Wallet}, {"expiration", strconv.FormatInt(deadline.Unix()+1, 10)}}}
	if s.enc == NIP44 {
		ev.Tags = append(ev.Tags, nostr.Tag{"encryption", string(NIP44)})
	}
	if err := ev.Sign(s.c.uri.Secret); err != nil {
		return fmt.Errorf("nwc: %s: sign: %w", method, err)
	}
	ch := make(chan response, 1)
	s.mu.Lock()
	if s.Ended() {
		s.mu.Unlock()
		return s.cause
	}
	s.pending[ev.ID] = ch
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.pending, ev.ID)
		s.mu.Unlock()
	}
	if err := s.relay.Publish(ctx, ev); err != nil {
		forget()
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %s: publishing the request", ErrTimeout, method)
		}
		return fmt.Errorf("%w: %s: relay %s: %v", ErrUnreachable, method, s.relay.URL, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return fmt.Errorf("%w: %s: the connection ended before the wallet answered", ErrUnreachable, method)
		}
		if r.Error != nil && r.Error.Code != "" {
			return &WalletError{Method: method, Code: r.Error.Code, Message: r.Error.Message}
		}
		if r.ResultType != "" && r.ResultType != method {
			return fmt.Errorf("nwc: %s: the wallet answered a %s", method, r.ResultType)
		}
		if result != nil {
			if len(r.Result) == 0 || string(r.Result) == "null" {
				return fmt.Errorf("nwc: %s: the wallet's answer has no result", method)
			}
			if err := json.Unmarshal(r.Result, result); err != nil {
				return fmt.Errorf("nwc: %s: the wallet's answer does not decode: %w", method, err)
			}
		}
		return nil
	case <-ctx.Done():
		forget()
		if errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("nwc: %s: %w", method, ctx.Err()) // the caller gave up
		}
		return fmt.Errorf("%w: %s: no answer within %s", ErrTimeout, method, timeout)
	}
}
