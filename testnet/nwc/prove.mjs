// Proves the wallet service (service.mjs) against Alby's own NWCClient,
// the SDK's implementation of the client side, hold invoices and
// notifications included. Run by billing/nwc's TestWalletService:
//
//   node prove.mjs <nostr+walletconnect URI of the "hold" connection> <plain URI> \
//       <a 7 sat invoice of the customer node> <its payment hash>
//
// Each invoice to pay is written as a line "PAY <bolt11>" (the Go test
// pays it from the customer node, a hold invoice in the background); what
// the client saw is written as lines "<WORD> <json>". The wallet pays the
// customer's invoice (pay_invoice, as capvend pays a refund) and finds
// that outgoing payment again (lookup_invoice, list_transactions). Exits
// 0 after "DONE", 1 on any error.
import { WebSocket } from 'ws';
import { createHash, randomBytes } from 'node:crypto';

globalThis.WebSocket ??= WebSocket;
const { NWCClient } = await import('@getalby/sdk/nwc');

const [holdURI, plainURI, payInvoice, payHash] = process.argv.slice(2);
if (!payHash) {
  console.error('usage: node prove.mjs <hold-uri> <plain-uri> <invoice-to-pay> <its-payment-hash>');
  process.exit(2);
}
const out = (word, v) => process.stdout.write(`${word} ${JSON.stringify(v)}\n`);
const must = (cond, what) => { if (!cond) throw new Error(what); };

const client = new NWCClient({ nostrWalletConnectUrl: holdURI });
const seen = [];
let wake = () => {};
const unsub = await client.subscribeNotifications((n) => { seen.push(n); wake(); });
const waitFor = (type, hash) => new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`no ${type} for ${hash} in 20 s`)), 20_000);
  const look = () => {
    const n = seen.find((x) => x.notification_type === type && x.notification.payment_hash === hash);
    if (n) { clearTimeout(timer); resolve(n.notification); } else { wake = look; }
  };
  look();
});

try {
  const info = await client.getInfo();
  must(['make_hold_invoice', 'settle_hold_invoice', 'cancel_hold_invoice', 'make_invoice', 'lookup_invoice']
    .every((m) => info.methods.includes(m)), 'get_info lacks methods: ' + info.methods);
  must(info.notifications.includes('hold_invoice_accepted') && info.notifications.includes('payment_received'), 'notifications');
  out('INFO', { methods: info.methods, notifications: info.notifications, encryption: client.encryptionType });

  // A plain invoice: paid, notified, looked up, listed.
  const inv = await client.makeInvoice({ amount: 21_000, description: 'prove plain' });
  must(inv.state === 'pending' && inv.amount === 21_000, 'make_invoice ' + JSON.stringify(inv));
  out('PAY', inv.invoice);
  const got = await waitFor('payment_received', inv.payment_hash);
  must(got.amount === 21_000 && got.state === 'settled', 'payment_received ' + JSON.stringify(got));
  const look = await client.lookupInvoice({ payment_hash: inv.payment_hash });
  must(look.state === 'settled' && look.preimage, 'lookup_invoice ' + JSON.stringify(look));
  must(createHash('sha256').update(Buffer.from(look.preimage, 'hex')).digest('hex') === inv.payment_hash, 'preimage');
  out('RECEIVED', { payment_hash: inv.payment_hash, amount: got.amount });

  // A hold invoice: accepted, then settled.
  const pre = randomBytes(32);
  const hash = createHash('sha256').update(pre).digest('hex');
  const hold = await client.makeHoldInvoice({ amount: 30_000, description: 'prove hold', payment_hash: hash, expiry: 600 });
  must(hold.payment_hash === hash, 'make_hold_invoice hash');
  out('PAY', hold.invoice);
  const acc = await waitFor('hold_invoice_accepted', hash);
  must(acc.amount === 30_000, 'hold_invoice_accepted ' + JSON.stringify(acc));
  must((await client.lookupInvoice({ payment_hash: hash })).state === 'accepted', 'lookup of a held invoice');
  await client.settleHoldInvoice({ preimage: pre.toString('hex') });
  const settled = await waitFor('payment_received', hash);
  must(settled.state === 'settled', 'settled hold ' + JSON.stringify(settled));
  out('SETTLED', { payment_hash: hash, amount: settled.amount });

  // A hold invoice: accepted, then canceled (the payer's money returns).
  const pre2 = randomBytes(32);
  const hash2 = createHash('sha256').update(pre2).digest('hex');
  const hold2 = await client.makeHoldInvoice({ amount: 40_000, description: 'prove cancel', payment_hash: hash2, expiry: 600 });
  out('PAY', hold2.invoice);
  await waitFor('hold_invoice_accepted', hash2);
  await client.cancelHoldInvoice({ payment_hash: hash2 });
  const canceled = await client.lookupInvoice({ payment_hash: hash2 });
  must(canceled.state === 'failed', 'lookup of a canceled hold invoice ' + JSON.stringify(canceled));
  out('CANCELED', { payment_hash: hash2 });

  // The transactions of the connection.
  const list = await client.listTransactions({ unpaid: true, limit: 10 });
  const hashes = list.transactions.map((t) => t.payment_hash);
  must([inv.payment_hash, hash, hash2].every((h) => hashes.includes(h)), 'list_transactions ' + hashes);
  out('LISTED', list.transactions.length);

  // A lookup of an unknown invoice is NOT_FOUND.
  try {
    await client.lookupInvoice({ payment_hash: randomBytes(32).toString('hex') });
    throw new Error('an unknown invoice was found');
  } catch (e) {
    must(e.code === 'NOT_FOUND', 'unknown invoice: ' + e.code + ' ' + e.message);
  }
  out('NOTFOUND', true);

  // pay_invoice: the wallet pays the customer's invoice (a refund); its
  // preimage proves it, and the outgoing payment is found again by
  // lookup_invoice and list_transactions, with the fee it reported.
  const paid = await client.payInvoice({ invoice: payInvoice });
  must(createHash('sha256').update(Buffer.from(paid.preimage, 'hex')).digest('hex') === payHash, 'pay_invoice preimage ' + JSON.stringify(paid));
  must(Number.isInteger(paid.fees_paid) && paid.fees_paid >= 0, 'pay_invoice fees_paid ' + JSON.stringify(paid));
  const sent = await client.lookupInvoice({ payment_hash: payHash });
  must(sent.type === 'outgoing' && sent.state === 'settled' && sent.amount === 7_000 && sent.fees_paid === paid.fees_paid
    && sent.preimage === paid.preimage, 'lookup_invoice of the payment ' + JSON.stringify(sent));
  const sentList = await client.listTransactions({ type: 'outgoing', limit: 10 });
  must(sentList.transactions.some((t) => t.payment_hash === payHash && t.type === 'outgoing'), 'list_transactions outgoing');
  try {
    await client.payInvoice({ invoice: payInvoice });
    throw new Error('an invoice was paid twice');
  } catch (e) {
    must(e.code === 'PAYMENT_FAILED', 'paying a paid invoice: ' + e.code + ' ' + e.message);
  }
  out('PAID', { payment_hash: payHash, amount: sent.amount, fees_paid: paid.fees_paid });

  // The plain connection may not make hold invoices.
  const plain = new NWCClient({ nostrWalletConnectUrl: plainURI });
  const pinfo = await plain.getInfo();
  must(!pinfo.methods.includes('make_hold_invoice'), 'plain get_info offers hold invoices');
  try {
    await plain.makeHoldInvoice({ amount: 1000, payment_hash: hash2 });
    throw new Error('the plain connection made a hold invoice');
  } catch (e) {
    must(e.code === 'RESTRICTED', 'plain make_hold_invoice: ' + e.code + ' ' + e.message);
  }
  out('RESTRICTED', true);
  plain.close();

  unsub();
  client.close();
  out('DONE', true);
  process.exit(0);
} catch (err) {
  console.error('prove:', err && err.stack ? err.stack : err);
  process.exit(1);
}
