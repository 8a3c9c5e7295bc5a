// The regtest stack's NWC wallet service: Alby's NWCWalletService
// (@getalby/sdk) in front of one of the stack's LND nodes, reached over
// LND's REST API. Run by testnet (StartNWC, `capvend testnet up --nwc`):
//
//   node service.mjs --relay ws://127.0.0.1:PORT --lnd-rest 127.0.0.1:PORT \
//       --macaroon admin.macaroon --out connections.json
//
// (NODE_EXTRA_CA_CERTS names LND's tls.cert.) NWCWalletService does the
// protocol: the relay pool, NIP-04/NIP-44, signing, and dispatching the
// standard methods to the handler below. Two things it lacks are added
// here: the hold-invoice methods (make_hold_invoice, settle_hold_invoice,
// cancel_hold_invoice: LND's invoicesrpc hold invoices), answered for
// requests the SDK's dispatch leaves alone, and notifications
// (payment_received, hold_invoice_accepted), published from LND's invoice
// streams for the invoices a connection made. pay_invoice pays from the
// node (capvend's refunds), and lookup_invoice and list_transactions
// find those outgoing payments too (LND's payments), as NIP-47 asks.
//
// It serves four connections, as a wallet grants them to apps:
//   hold:    every method, hold invoices included; NIP-44 and NIP-04
//   plain:   no hold-invoice methods; NIP-44 and NIP-04
//   nip04:   every method; its info event offers NIP-04 only
//   receive: what capvend's doctor asks for: no pay_invoice, no get_balance
// and writes {"hold": "nostr+walletconnect://...", ...} to --out once it
// listens. It exits on SIGTERM.
import { WebSocket } from 'ws';
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync, renameSync } from 'node:fs';

globalThis.WebSocket ??= WebSocket; // before the SDK (nostr-tools) loads
// NWCWalletService publishes each answer with Promise.any(...) and no
// catch: a relay that refuses it (khatru's "mute: no one was listening"
// when the client's connection just dropped) would kill the process with
// an unhandled rejection. A wallet outlives its clients' outages.
process.on('unhandledRejection', (e) => console.log(new Date().toISOString(), 'unhandled rejection (an answer nobody took?):',
  e?.errors?.map((x) => x.message).join('; ') || e?.message || e));
const { NWCWalletService, NWCWalletServiceKeyPair } = await import('@getalby/sdk/nwc');
const { getPublicKey } = await import('nostr-tools/pure');

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
for (const k of ['relay', 'lnd-rest', 'macaroon', 'out']) {
  if (!args[k]) {
    console.error(`usage: node service.mjs --relay URL --lnd-rest HOST:PORT --macaroon FILE --out FILE (missing --${k})`);
    process.exit(2);
  }
}
const log = (...a) => console.log(new Date().toISOString(), ...a);
const macaroon = readFileSync(args.macaroon).toString('hex');
const rest = `https://${args['lnd-rest']}`;

// ---- LND REST ----
async function lnd(method, path, body) {
  const res = await fetch(rest + path, {
    method, headers: { 'Grpc-Metadata-macaroon': macaroon, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json;
  try { json = JSON.parse(text); } catch { json = { message: text }; }
  if (!res.ok) {
    const err = new Error(json.message || json.error || `LND ${res.status}`);
    err.status = res.status;
    throw err;
  }
  return json;
}

// lndStream follows a streaming REST endpoint, calling onMessage with each
// result, and reconnects when it breaks, until stop() or done() says so.
function lndStream(path, onMessage, done = () => false) {
  let stopped = false;
  const ctl = new AbortController();
  (async () => {
    while (!stopped && !done()) {
      try {
        const res = await fetch(rest + path, { headers: { 'Grpc-Metadata-macaroon': macaroon }, signal: ctl.signal });
        if (!res.ok) throw new Error(`stream ${path}: HTTP ${res.status}`);
        const dec = new TextDecoder();
        let buf = '';
        for await (const chunk of res.body) {
          buf += dec.decode(chunk, { stream: true });
          let nl;
          while ((nl = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, nl).trim();
            buf = buf.slice(nl + 1);
            if (!line) continue;
            const msg = JSON.parse(line);
            if (msg.result) await onMessage(msg.result);
            if (done()) return;
          }
        }
      } catch (e) {
        if (stopped) return;
        log('stream', path, 'broke:', e.message);
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  })();
  return () => { stopped = true; ctl.abort(); };
}

const b64 = (hex) => Buffer.from(hex, 'hex').toString('base64');
// LND's REST path wants URL-safe base64 with its padding.
const b64url = (hex) => Buffer.from(hex, 'hex').toString('base64').replace(/\+/g, '-').replace(/\//g, '_');
const hexOf = (b) => (b ? Buffer.from(b, 'base64').toString('hex') : '');
const now = () => Math.floor(Date.now() / 1000);

// tx makes NIP-47's transaction of an LND invoice.
function tx(inv) {
  const created = Number(inv.creation_date || 0);
  const expires = created + Number(inv.expiry || 0);
  let state = 'pending';
  switch (inv.state) {
    case 'SETTLED': state = 'settled'; break;
    case 'ACCEPTED': state = 'accepted'; break;
    case 'CANCELED': state = expires && now() >= expires ? 'expired' : 'failed'; break;
    default: if (expires && now() >= expires) state = 'expired';
  }
  const t = {
    type: 'incoming', state, invoice: inv.payment_request, description: inv.memo || '',
    description_hash: hexOf(inv.description_hash), preimage: state === 'settled' ? hexOf(inv.r_preimage) : '',
    payment_hash: hexOf(inv.r_hash), amount: Number(state === 'settled' || state === 'accepted'
      ? (inv.amt_paid_msat && inv.amt_paid_msat !== '0' ? inv.amt_paid_msat : inv.value_msat) : inv.value_msat),
    fees_paid: 0, created_at: created, expires_at: expires,
    settled_at: state === 'settled' ? Number(inv.settle_date || 0) : undefined,
  };
  if (state === 'accepted' && inv.htlcs?.length) {
    t.settle_deadline = Math.min(...inv.htlcs.map((h) => Number(h.expiry_height || 0)));
  }
  return t;
}

// outTx makes NIP-47's transaction of an LND payment (outgoing).
function outTx(p) {
  let state = 'pending';
  if (p.status === 'SUCCEEDED') state = 'settled';
  if (p.status === 'FAILED') state = 'failed';
  const created = Number(p.creation_date || 0) || Math.floor(Number(p.creation_time_ns || 0) / 1e9);
  const resolved = (p.htlcs || []).filter((h) => h.status === 'SUCCEEDED').map((h) => Math.floor(Number(h.resolve_time_ns || 0) / 1e9));
  return {
    type: 'outgoing', state, invoice: p.payment_request || '', description: '', description_hash: '',
    preimage: state === 'settled' ? p.payment_preimage : '', payment_hash: p.payment_hash,
    amount: Number(p.value_msat || 0), fees_paid: Number(p.fee_msat || 0), created_at: created,
    settled_at: state === 'settled' ? (resolved.length ? Math.max(...resolved) : created) : undefined,
  };
}

// payments lists the node's outgoing payments, in flight ones too.
async function payments() {
  return (await lnd('GET', '/v1/payments?include_incomplete=true&reversed=true&max_payments=100000')).payments || [];
}

const ok = (result) => ({ result, error: undefined });
const fail = (code, message) => ({ result: undefined, error: { code, message } });
const lndFail = (e) => (e.status === 404 || /unable to locate|not found|no invoice/i.test(e.message)
  ? fail('NOT_FOUND', e.message) : fail('INTERNAL', e.message));

// ---- connections ----
const ALL = ['get_info', 'make_invoice', 'lookup_invoice', 'list_transactions', 'pay_invoice', 'get_balance',
  'make_hold_invoice', 'settle_hold_invoice', 'cancel_hold_invoice'];
const HOLD = new Set(['make_hold_invoice', 'settle_hold_invoice', 'cancel_hold_invoice']);
const NOTES = ['payment_received', 'hold_invoice_accepted'];
const specs = [
  { name: 'hold', methods: ALL, enc: ['nip44_v2', 'nip04'] },
  { name: 'plain', methods: ALL.filter((m) => !HOLD.has(m)), enc: ['nip44_v2', 'nip04'] },
  { name: 'nip04', methods: ALL, enc: ['nip04'] },
  // What capvend's doctor asks a seller to grant: receiving only.
  { name: 'receive', methods: ALL.filter((m) => m !== 'pay_invoice' && m !== 'get_balance'), enc: ['nip44_v2', 'nip04'] },
];
// The hold-invoice methods are answered here: the SDK's dispatch would
// answer NOT_IMPLEMENTED. Requests of other methods go on to it.
const holdMethods = { make_hold_invoice: 'makeHoldInvoice', settle_hold_invoice: 'settleHoldInvoice', cancel_hold_invoice: 'cancelHoldInvoice' };
class HoldWalletService extends NWCWalletService {
  async subscribe(keypair, h, spec) {
    const pool = this.pool;
    const orig = pool.subscribe.bind(pool);
    pool.subscribe = (urls, filter, params) => {
      pool.subscribe = orig;
      const inner = params.onevent;
      return orig(urls, filter, { ...params, onevent: async (event) => {
        if (!(await this.#hold(keypair, h, spec, event))) await inner(event);
      } });
    };
    return super.subscribe(keypair, h);
  }

  async #hold(keypair, h, spec, event) {
    const enc = event.tags.find((t) => t[0] === 'encryption')?.[1] || 'nip04';
    const conn = conns.find((c) => c.keypair === keypair);
    if (conn) conn.enc = enc;
    let request;
    try { request = JSON.parse(await this.decrypt(keypair, event.content, enc)); } catch { return false; }
    const fn = holdMethods[request.method];
    if (!fn) return false;
    const response = spec.methods.includes(request.method)
      ? await h[fn](request.params || {}) : fail('RESTRICTED', `${request.method} not granted`);
    const reply = await this.signEvent({
      kind: 23195, created_at: now(), tags: [['e', event.id], ['p', keypair.clientPubkey]],
      content: await this.encrypt(keypair, JSON.stringify({ result_type: request.method, ...response }), enc),
    }, keypair.walletSecret);
    await Promise.any(this.pool.publish(this.relayUrls, reply)).catch((e) => log('reply publish failed', e.message));
    return true;
  }
}
const service = new HoldWalletService({ relayUrls: [args.relay] });
const owner = new Map(); // payment hash -> the connection that made the invoice
const payer = new Map(); // payment hash -> the connection that paid it (pay_invoice)
const notified = new Set(); // "type:hash" notifications published

async function notify(conn, type, t) {
  const key = `${type}:${t.payment_hash}`;
  if (notified.has(key)) return;
  notified.add(key);
  const body = JSON.stringify({ notification_type: type, notification: t });
  // In the encryption its client speaks (known from its requests), else
  // in every one the connection offers.
  for (const enc of conn.enc ? [conn.enc] : conn.spec.enc) {
    const event = await service.signEvent({
      kind: enc === 'nip04' ? 23196 : 23197, created_at: now(),
      tags: [['p', conn.keypair.clientPubkey]], content: await service.encrypt(conn.keypair, body, enc),
    }, conn.keypair.walletSecret);
    await Promise.any(service.pool.publish(service.relayUrls, event)).catch((e) => log('notify publish failed', e.message));
  }
  log('notified', conn.spec.name, type, t.payment_hash);
}

function handler(conn) {
  const can = (m) => conn.spec.methods.includes(m);
  return {
    async getInfo() {
      const gi = await lnd('GET', '/v1/getinfo');
      return ok({ alias: gi.alias, color: gi.color, pubkey: gi.identity_pubkey, network: 'regtest',
        block_height: gi.block_height, block_hash: gi.block_hash, methods: conn.spec.methods, notifications: NOTES });
    },
    async makeInvoice(r) {
      if (!can('make_invoice')) return fail('RESTRICTED', 'make_invoice not granted');
      try {
        const inv = await lnd('POST', '/v1/invoices', { value_msat: String(r.amount), memo: r.description || '',
          expiry: String(r.expiry || 86400) });
        const hash = hexOf(inv.r_hash);
        owner.set(hash, conn);
        return ok(tx(await lnd('GET', `/v1/invoice/${hash}`)));
      } catch (e) { return lndFail(e); }
    },
    // An invoice the node issued (incoming), else a payment it made
    // (outgoing: capvend looks up a refund it paid), else NOT_FOUND.
    async lookupInvoice(r) {
      if (!can('lookup_invoice')) return fail('RESTRICTED', 'lookup_invoice not granted');
      if (!r.payment_hash) return fail('OTHER', 'lookup by payment_hash only');
      try { return ok(tx(await lnd('GET', `/v1/invoice/${r.payment_hash}`))); } catch (e) {
        const miss = lndFail(e);
        if (miss.error.code !== 'NOT_FOUND') return miss;
      }
      try {
        const p = (await payments()).find((x) => x.payment_hash === r.payment_hash);
        return p ? ok(outTx(p)) : fail('NOT_FOUND', `no invoice or payment ${r.payment_hash}`);
      } catch (e) { return lndFail(e); }
    },
    async listTransactions(r) {
      if (!can('list_transactions')) return fail('RESTRICTED', 'list_transactions not granted');
      try {
        const res = await lnd('GET', '/v1/invoices?num_max_invoices=100000&reversed=true');
        let txs = r.type === 'outgoing' ? [] : (res.invoices || []).filter((i) => owner.get(hexOf(i.r_hash)) === conn).map(tx);
        if (r.type !== 'incoming') txs = txs.concat((await payments()).filter((p) => payer.get(p.payment_hash) === conn).map(outTx));
        if (r.from) txs = txs.filter((t) => t.created_at >= r.from);
        if (r.until) txs = txs.filter((t) => t.created_at <= r.until);
        if (!r.unpaid) txs = txs.filter((t) => t.state === 'settled' || t.state === 'accepted');
        txs.sort((a, b) => b.created_at - a.created_at);
        const total = txs.length;
        txs = txs.slice(r.offset || 0, (r.offset || 0) + (r.limit || 50));
        return ok({ transactions: txs, total_count: total });
      } catch (e) { return lndFail(e); }
    },
    // Pays from the node (LND's synchronous send: its answer is the
    // outcome), at most 10 sat of routing fee. The payment is the
    // connection's, listed among its outgoing transactions.
    async payInvoice(r) {
      if (!can('pay_invoice')) return fail('RESTRICTED', 'pay_invoice not granted');
      if (!r.invoice) return fail('OTHER', 'invoice is required');
      try {
        const pr = await lnd('GET', `/v1/payreq/${r.invoice}`);
        payer.set(pr.payment_hash, conn);
      } catch (e) { return fail('OTHER', `not a payable invoice: ${e.message}`); }
      try {
        const res = await lnd('POST', '/v1/channels/transactions', { payment_request: r.invoice,
          amt_msat: r.amount ? String(r.amount) : undefined, fee_limit: { fixed_msat: '10000' } });
        if (res.payment_error) {
          log('pay_invoice failed', conn.spec.name, res.payment_error);
          return fail(/insufficient/i.test(res.payment_error) ? 'INSUFFICIENT_BALANCE' : 'PAYMENT_FAILED', res.payment_error);
        }
        log('paid', conn.spec.name, hexOf(res.payment_hash));
        return ok({ preimage: hexOf(res.payment_preimage), fees_paid: Number(res.payment_route?.total_fees_msat || 0) });
      } catch (e) { return fail(/insufficient/i.test(e.message) ? 'INSUFFICIENT_BALANCE' : 'PAYMENT_FAILED', e.message); }
    },
    async getBalance() {
      try { return ok({ balance: Number((await lnd('GET', '/v1/balance/channels')).local_balance?.msat || 0) }); } catch (e) { return lndFail(e); }
    },
    // The hold-invoice methods NWCWalletService does not dispatch.
    async makeHoldInvoice(r) {
      if (!r.payment_hash || !r.amount) return fail('OTHER', 'amount and payment_hash are required');
      try {
        const expiry = Number(r.expiry || 86400);
        const res = await lnd('POST', '/v2/invoices/hodl', { hash: b64(r.payment_hash), value_msat: String(r.amount),
          memo: r.description || '', expiry: String(expiry), cltv_expiry: String(r.min_cltv_expiry_delta || 80) });
        owner.set(r.payment_hash, conn);
        watchHold(conn, r.payment_hash);
        const created = now(); // the answer without another round trip to LND
        return ok({ type: 'incoming', state: 'pending', invoice: res.payment_request, description: r.description || '',
          description_hash: '', preimage: '', payment_hash: r.payment_hash, amount: Number(r.amount), fees_paid: 0,
          created_at: created, expires_at: created + expiry });
      } catch (e) { return lndFail(e); }
    },
    async settleHoldInvoice(r) {
      try { await lnd('POST', '/v2/invoices/settle', { preimage: b64(r.preimage) }); return ok({}); } catch (e) { return lndFail(e); }
    },
    async cancelHoldInvoice(r) {
      try { await lnd('POST', '/v2/invoices/cancel', { payment_hash: b64(r.payment_hash) }); return ok({}); } catch (e) { return lndFail(e); }
    },
  };
}

// watchHold follows one hold invoice until it ends: accepted is notified
// (LND's all-invoices stream does not carry it).
function watchHold(conn, hash) {
  let over = false;
  lndStream(`/v2/invoices/subscribe/${b64url(hash)}`, async (inv) => {
    if (inv.state === 'ACCEPTED') await notify(conn, 'hold_invoice_accepted', tx(inv));
    if (inv.state === 'SETTLED' || inv.state === 'CANCELED') over = true;
  }, () => over);
}


const conns = [];
const uris = {};
for (const spec of specs) {
  const walletSecret = randomBytes(32).toString('hex');
  const clientSecret = randomBytes(32).toString('hex');
  const keypair = new NWCWalletServiceKeyPair(walletSecret, getPublicKey(Buffer.from(clientSecret, 'hex')));
  const conn = { spec, keypair };
  conns.push(conn);
  if (spec.enc.includes('nip44_v2')) {
    await service.publishWalletServiceInfoEvent(walletSecret, spec.methods, NOTES);
  } else {
    const info = await service.signEvent({ kind: 13194, created_at: now(),
      tags: [['notifications', NOTES.join(' ')]], content: spec.methods.join(' ') }, walletSecret);
    await Promise.any(service.pool.publish(service.relayUrls, info));
  }
  await service.subscribe(keypair, handler(conn), spec);
  uris[spec.name] = `nostr+walletconnect://${keypair.walletPubkey}?relay=${encodeURIComponent(args.relay)}&secret=${clientSecret}`;
}

// payment_received for every invoice a connection made, from LND's
// all-invoices stream (settlements of plain and hold invoices alike).
const stopInvoices = lndStream('/v1/invoices/subscribe', async (inv) => {
  if (inv.state !== 'SETTLED') return;
  const conn = owner.get(hexOf(inv.r_hash));
  if (conn) await notify(conn, 'payment_received', tx(inv));
});

writeFileSync(args.out + '.tmp', JSON.stringify(uris, null, 2), { mode: 0o600 });
renameSync(args.out + '.tmp', args.out);
log('nwc wallet service ready:', Object.keys(uris).join(', '), 'on', args.relay);

const stop = () => { stopInvoices(); service.close(); process.exit(0); };
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
