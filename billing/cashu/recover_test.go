package cashu_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil/hdkeychain"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/decred/dcrd/dcrec/secp256k1/v4"
	gcashu "github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/cashu/nuts/nut13"
	"github.com/elnosh/gonuts/crypto"
	"github.com/elnosh/gonuts/wallet/storage"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestRecoversLostMintAnswer: capvend asked the mint to mint a paid quote,
// the mint signed, and the answer was lost (connection broke, crash). The
// ecash is restored from the mint (NUT-09), the settlement recorded, and the
// wallet is not left reusing outputs the mint already signed.
func TestRecoversLostMintAnswer(t *testing.T) {
	needStack(t)
	t.Parallel() // see "Parallel tests" in main_test.go
	ctx := context.Background()
	l := openLedger(t)
	dir := t.TempDir()
	wdir := filepath.Join(dir, "wallet")

	b1 := newBackend(t, l, stack.MintURL, dir)
	c := priced(t, l, 8)
	p, err := b1.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b1.Close() // capvend goes down
	if err := pay(ctx, p.Bolt11); err != nil {
		t.Fatal(err)
	}
	mintLostAnswer(t, wdir, p.Ref, 8)

	b2 := newBackend(t, l, stack.MintURL, dir)
	ev := newEvents()
	runBackend(t, b2, ev)
	ev.wait(t, p.Ref, vend.PaymentSettled, 60*time.Second)

	// The wallet mints again: its counter moved past the lost outputs.
	c2 := priced(t, l, 5)
	p2, err := b2.Request(ctx, vend.PaymentRequest{CallID: c2.ID, Amount: c2.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(ctx, p2.Bolt11); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, p2.Ref, vend.PaymentSettled, 60*time.Second)
	b2.Close()
	bals, err := cashu.Balances(ctx, wdir, []string{stack.MintURL}, l)
	if err != nil {
		t.Fatal(err)
	}
	if bals[0].Wallet != 13_000 || bals[0].Difference() != 0 {
		t.Fatalf("wallet and ledger after recovery: %+v", bals)
	}
	if got := account(verifyLedger(t, l), ledger.CashuAccount(stack.MintURL)); got != 13_000 {
		t.Fatalf("assets %d", got)
	}
}

// TestQuoteMintedBySomeoneElse: whoever knows a quote's id can mint its
// ecash once it is paid. If someone else did, capvend got nothing: the
// payment must not be recorded as settled (the call would run for free).
func TestQuoteMintedBySomeoneElse(t *testing.T) {
	needStack(t)
	t.Parallel() // see "Parallel tests" in main_test.go
	ctx := context.Background()
	l := openLedger(t)
	dir := t.TempDir()
	b1 := newBackend(t, l, stack.MintURL, dir)
	c := priced(t, l, 4)
	p, err := b1.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b1.Close()
	if err := pay(ctx, p.Bolt11); err != nil {
		t.Fatal(err)
	}
	mintOutputs(t, p.Ref, randomOutputs(t, 4)) // the thief
	b2 := newBackend(t, l, stack.MintURL, dir)
	ev := newEvents()
	runBackend(t, b2, ev)
	// Expiry is recorded; a settlement never is.
	ev.wait(t, p.Ref, vend.PaymentExpired, 60*time.Second)
	// A check after the expiry, which must book nothing either.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hang guard
	defer cancel()
	if err := b2.CheckNow(cctx, p.Ref); err != nil {
		t.Fatalf("the quote was not checked again after its expiry: %v", err)
	}
	if got, _ := l.Payment(ctx, p.Ref); got.State != vend.PaymentExpired {
		t.Fatalf("payment is %s", got.State)
	}
	if revenue(verifyLedger(t, l)) != 0 {
		t.Fatal("revenue booked for ecash someone else minted")
	}
}

func randomOutputs(t *testing.T, sats uint64) gcashu.BlindedMessages {
	t.Helper()
	var id string
	ks, err := http.Get(stack.MintURL + "/v1/keysets")
	if err != nil {
		t.Fatal(err)
	}
	var kr struct {
		Keysets []struct {
			Id     string `json:"id"`
			Active bool   `json:"active"`
		} `json:"keysets"`
	}
	json.NewDecoder(ks.Body).Decode(&kr)
	ks.Body.Close()
	for _, k := range kr.Keysets {
		if k.Active {
			id = k.Id
		}
	}
	var outs gcashu.BlindedMessages
	for _, amt := range gcashu.AmountSplit(sats) {
		r, err := secp256k1.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		secret := make([]byte, 32)
		rand.Read(secret)
		B, _, err := crypto.BlindMessage(hex.EncodeToString(secret), r)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, gcashu.BlindedMessage{Amount: amt, Id: id, B_: hex.EncodeToString(B.SerializeCompressed())})
	}
	return outs
}

// mintLostAnswer does what gonuts' MintTokens does up to the mint's answer,
// which it drops: the outputs derive from the wallet's counter, which does
// not move.
func mintLostAnswer(t *testing.T, wdir, quote string, sats uint64) {
	t.Helper()
	db, err := storage.InitBolt(wdir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	master, err := hdkeychain.NewMaster(db.GetSeed(), &chaincfg.MainNetParams)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, ks := range db.GetKeysets()[stack.MintURL] {
		if ks.Active {
			id = ks.Id
		}
	}
	path, err := nut13.DeriveKeysetPath(master, id)
	if err != nil {
		t.Fatal(err)
	}
	counter := db.GetKeysetCounter(id)
	var outs gcashu.BlindedMessages
	for _, amt := range gcashu.AmountSplit(sats) {
		secret, _ := nut13.DeriveSecret(path, counter)
		r, _ := nut13.DeriveBlindingFactor(path, counter)
		B, _, err := crypto.BlindMessage(secret, r)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, gcashu.BlindedMessage{Amount: amt, Id: id, B_: hex.EncodeToString(B.SerializeCompressed())})
		counter++
	}
	mintOutputs(t, quote, outs)
}

// mintOutputs asks the mint to sign outs for a paid quote and drops the
// answer.
func mintOutputs(t *testing.T, quote string, outs gcashu.BlindedMessages) {
	t.Helper()
	body, _ := json.Marshal(nut04.PostMintBolt11Request{Quote: quote, Outputs: outs})
	var resp *http.Response
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err = http.Post(stack.MintURL+"/v1/mint/bolt11", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the mint may not have seen the payment yet
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("mint: HTTP %d", resp.StatusCode)
	}
}
