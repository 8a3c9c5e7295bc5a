// The stock @contextvm/sdk client against `capvend serve`'s ContextVM front
// through a relay that limits message sizes, run by
// internal/cli/contextvm_oversized_test.go:
//
//   node oversized.mjs <relay-url> <server-pubkey-hex> <encryption: disabled|optional> <tool> <kib,...> <arg-tool> <arg-bytes>
//
// It calls <tool> {"kib": k} for each k (answers too large for one event:
// CEP-22 oversized transfers to the client), then <arg-tool> {"text":
// <arg-bytes> bytes} (a request too large for one event: an oversized
// transfer to the server). Calls pass onprogress: the MCP SDK then sends a
// progressToken, which CEP-22 needs. A payment request is written to
// stdout as "PAY <bolt11>" (the Go test pays it); results as lines
// "BIG<k> <bytes> <sha256 hex of the text>" and "ARG <text of the answer>".
// Exits 0 after "DONE", 1 on any error.
//
// With encryption the SDK measures a whole request as one gift wrap before
// it splits it, and NIP-44 takes at most 65535 bytes: it can send an
// oversized encrypted request only while the signed request stays under
// that (and with chunks of at most 16000 bytes: see chunkSizeBytes).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { NostrClientTransport, withClientPayments } from '@contextvm/sdk';
import { createHash, randomBytes } from 'node:crypto';

const [relay, serverPubkey, encryption, tool, kibs, argTool, argBytes] = process.argv.slice(2);
if (!argBytes) {
  console.error('usage: node oversized.mjs <relay-url> <server-pubkey-hex> <encryption> <tool> <kib,...> <arg-tool> <arg-bytes>');
  process.exit(2);
}

const transport = new NostrClientTransport({
  signer: randomBytes(32).toString('hex'), // a fresh client identity
  relayHandler: [relay],
  serverPubkey,
  encryptionMode: encryption,
  logLevel: 'error',
  // The SDK's default chunk size makes gift-wrapped frames over NIP-44's
  // 65535 bytes (it throws); 8000 works plain and encrypted.
  oversizedTransfer: { chunkSizeBytes: 8000 },
});
transport.onerror = (err) => console.error('transport error:', err && err.message ? err.message : err);
const paying = withClientPayments(transport, {
  handlers: [{
    pmi: 'bitcoin-lightning-bolt11',
    async handle(req) {
      process.stdout.write(`PAY ${req.pay_req}\n`);
    },
  }],
});
const client = new Client({ name: 'capvend-contextvm-oversized', version: '1.0.0' });
const timeout = { timeout: 180_000, resetTimeoutOnProgress: true, onprogress: () => {} };

try {
  await client.connect(paying, timeout);
  for (const kib of kibs.split(',').map(Number)) {
    const res = await client.callTool({ name: tool, arguments: { kib } }, undefined, timeout);
    const text = res.content[0].text;
    const bytes = Buffer.byteLength(text, 'utf8');
    process.stdout.write(`BIG${kib} ${bytes} ${createHash('sha256').update(text, 'utf8').digest('hex')}\n`);
  }
  const arg = 'a'.repeat(Number(argBytes));
  const res = await client.callTool({ name: argTool, arguments: { text: arg } }, undefined, timeout);
  process.stdout.write(`ARG ${res.content[0].text}\n`);
  process.stdout.write('DONE true\n');
  await client.close();
  process.exit(0);
} catch (err) {
  console.error('contextvm client:', err && err.stack ? err.stack : err);
  process.exit(1);
}
