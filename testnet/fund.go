package testnet

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/btcsuite/btcd/txscript"
	"github.com/btcsuite/btcd/wire"
)

// miner holds the key btcd mines to. btcd has no generatetoaddress and
// takes its mining address at start, before any lnd wallet exists; so the
// stack mines to this key and then pays the lnd wallets from a matured
// coinbase. The key lives only in memory for the duration of Start.
type miner struct {
	key  *btcec.PrivateKey
	addr btcutil.Address // P2PKH: spendable without segwit
}

func newMiner() (*miner, error) {
	k, err := btcec.NewPrivateKey()
	if err != nil {
		return nil, err
	}
	a, err := btcutil.NewAddressPubKeyHash(btcutil.Hash160(k.PubKey().SerializeCompressed()), &chaincfg.RegressionNetParams)
	if err != nil {
		return nil, err
	}
	return &miner{key: k, addr: a}, nil
}

// payout is one output of the funding transaction.
type payout struct {
	addr string
	sats int64
}

// fund spends the coinbase of block 1 (50 BTC, mature once the chain is
// past height 100) to outs, the remainder minus a fee going to the last
// output, and returns the txid. The transaction is broadcast through btcd
// and still needs mining.
func (m *miner) fund(ctx context.Context, c *btcdRPC, outs []payout) (string, error) {
	var hash string
	if err := c.call(ctx, "getblockhash", []any{1}, &hash); err != nil {
		return "", err
	}
	var blk struct {
		Tx []string `json:"tx"`
	}
	if err := c.call(ctx, "getblock", []any{hash, 1}, &blk); err != nil {
		return "", err
	}
	if len(blk.Tx) == 0 {
		return "", fmt.Errorf("block 1 has no transactions")
	}
	cbHash, err := chainhash.NewHashFromStr(blk.Tx[0])
	if err != nil {
		return "", err
	}
	const coinbase = 50 * btcutil.SatoshiPerBitcoin
	const fee = 100_000
	pkScript, err := txscript.PayToAddrScript(m.addr)
	if err != nil {
		return "", err
	}
	tx := wire.NewMsgTx(wire.TxVersion)
	tx.AddTxIn(wire.NewTxIn(wire.NewOutPoint(cbHash, 0), nil, nil))
	var total int64
	for i, o := range outs {
		a, err := btcutil.DecodeAddress(o.addr, &chaincfg.RegressionNetParams)
		if err != nil {
			return "", fmt.Errorf("address %q: %w", o.addr, err)
		}
		script, err := txscript.PayToAddrScript(a)
		if err != nil {
			return "", err
		}
		v := o.sats
		if i == len(outs)-1 {
			v = coinbase - fee - total
		}
		if v <= 0 {
			return "", fmt.Errorf("funding outputs exceed the coinbase")
		}
		total += v
		tx.AddTxOut(wire.NewTxOut(v, script))
	}
	sig, err := txscript.SignatureScript(tx, 0, pkScript, txscript.SigHashAll, m.key, true)
	if err != nil {
		return "", err
	}
	tx.TxIn[0].SignatureScript = sig
	var buf bytes.Buffer
	if err := tx.Serialize(&buf); err != nil {
		return "", err
	}
	var txid string
	if err := c.call(ctx, "sendrawtransaction", []any{hex.EncodeToString(buf.Bytes())}, &txid); err != nil {
		return "", err
	}
	return txid, nil
}
