// The stock @contextvm/sdk client paying `capvend serve` by a CEP-8 direct
// payment, run by internal/cli/contextvm_direct_test.go:
//
//   node direct.mjs <relay-url> <server-pubkey-hex> <encryption: disabled|optional> <cashu-token>
//
// The SDK (0.11.14, and its master) has CEP-8's tag types but sends no
// direct_payment tag and reads no change tag: the script patches its
// transport, before constructing it, to add ["direct_payment",
// "bitcoin-cashu-v4-direct", <token>] to the tools/call event, and to note
// the tags and content of every inbound event (the change tag is on
// payment_accepted's; the SDK shows its application only the message).
// It calls t_sha256 {"text": "direct"} once and writes lines:
//   SENT <tags of the tools/call event>   RESULT <callTool result> | ERROR <message>
//   ACCEPTED <payment_accepted params>    CHANGE <change tag>   REJECTED <payment_rejected params>
//   PAY <bolt11> (a payment request: the test expects none)   DONE true
// Exits 0 after DONE whether the call succeeded or not, 1 on any other error.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { NostrClientTransport, withClientPayments } from '@contextvm/sdk';
import { BaseNostrTransport } from '@contextvm/sdk/transport';
import { randomBytes } from 'node:crypto';

const [relay, serverPubkey, encryption, token] = process.argv.slice(2);
if (!token) {
  console.error('usage: node direct.mjs <relay-url> <server-pubkey-hex> <encryption> <cashu-token>');
  process.exit(2);
}
const out = (word, v) => process.stdout.write(`${word} ${JSON.stringify(v)}\n`);
const PMI = 'bitcoin-cashu-v4-direct';

let pending = null; // the direct payment of the next tools/call
const inbound = []; // every inbound event (inside its wrap)
NostrClientTransport.prototype.sendMcpMessage = function (msg, pk, kind, tags, ...rest) {
  if (pending && msg.method === 'tools/call') {
    tags = [...tags, ['direct_payment', PMI, pending]];
    pending = null;
    out('SENT', tags.map((t) => (t[0] === 'direct_payment' ? [t[0], t[1], '<token>'] : t)));
  }
  return BaseNostrTransport.prototype.sendMcpMessage.call(this, msg, pk, kind, tags, ...rest);
};
const convert = NostrClientTransport.prototype.convertNostrEventToMcpMessage;
NostrClientTransport.prototype.convertNostrEventToMcpMessage = function (ev) {
  inbound.push(ev);
  return convert.call(this, ev);
};

const transport = new NostrClientTransport({
  signer: randomBytes(32).toString('hex'), // a fresh client identity
  relayHandler: [relay],
  serverPubkey,
  encryptionMode: encryption,
  logLevel: 'error',
});
const paying = withClientPayments(transport, {
  handlers: [{
    pmi: 'bitcoin-lightning-bolt11',
    async handle(req) {
      process.stdout.write(`PAY ${req.pay_req}\n`);
    },
  }],
});
const client = new Client({ name: 'capvend-contextvm-direct', version: '1.0.0' });
const timeout = { timeout: 60_000 };

try {
  await client.connect(paying, timeout);
  pending = token;
  try {
    const res = await client.callTool({ name: 't_sha256', arguments: { text: 'direct' } }, undefined, timeout);
    out('RESULT', res);
  } catch (err) {
    out('ERROR', err && err.message ? err.message : String(err));
  }
  for (const ev of inbound) {
    let msg;
    try { msg = JSON.parse(ev.content); } catch { continue; }
    if (msg.method === 'notifications/payment_accepted') {
      out('ACCEPTED', msg.params);
      const change = ev.tags.find((t) => t[0] === 'change');
      if (change) out('CHANGE', change);
    }
    if (msg.method === 'notifications/payment_rejected') out('REJECTED', msg.params);
  }
  out('DONE', true);
  await client.close();
  process.exit(0);
} catch (err) {
  console.error('contextvm direct client:', err && err.stack ? err.stack : err);
  process.exit(1);
}
