// The stock @contextvm/sdk client against `capvend serve`'s ContextVM front,
// run by internal/cli/contextvm_test.go:
//
//   node client.mjs <relay-url> <server-pubkey-hex> [encryption: disabled|optional]
//
// It lists the tools, calls t_word_count (free) and t_sha256 (priced). A
// payment request is written to stdout as a line "PAY <bolt11>" (the Go
// test pays it); results and what the SDK saw are written as lines
// "<WORD> <json>". Exits 0 after "DONE", 1 on any error.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { NostrClientTransport, withClientPayments } from '@contextvm/sdk';
import { randomBytes } from 'node:crypto';

const [relay, serverPubkey, encryption = 'disabled'] = process.argv.slice(2);
if (!relay || !serverPubkey) {
  console.error('usage: node client.mjs <relay-url> <server-pubkey-hex> [encryption]');
  process.exit(2);
}
const out = (word, v) => process.stdout.write(`${word} ${JSON.stringify(v)}\n`);

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
const client = new Client({ name: 'capvend-contextvm-interop', version: '1.0.0' });
const timeout = { timeout: 120_000, resetTimeoutOnProgress: true };

try {
  await client.connect(paying, timeout);
  const init = transport.getServerInitializeEvent();
  out('INIT', { server: client.getServerVersion(), tags: init ? init.tags : null,
    encryption: transport.serverSupportsEncryption() });
  const list = await client.listTools(undefined, timeout);
  out('TOOLS', list.tools.map((t) => t.name));
  const listEvent = transport.getServerToolsListEvent();
  out('CAPS', listEvent ? listEvent.tags.filter((t) => t[0] === 'cap') : null);
  const free = await client.callTool({ name: 't_word_count', arguments: { text: 'free as in beer' } }, undefined, timeout);
  out('FREE', free);
  const paid = await client.callTool({ name: 't_sha256', arguments: { text: 'hi' } }, undefined, timeout);
  out('PAID', paid);
  out('DONE', true);
  await client.close();
  process.exit(0);
} catch (err) {
  console.error('contextvm client:', err && err.stack ? err.stack : err);
  process.exit(1);
}
