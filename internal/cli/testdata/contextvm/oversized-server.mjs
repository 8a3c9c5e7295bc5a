// A stock @contextvm/sdk server (NostrServerTransport + the MCP SDK's
// McpServer) with answers and requests too large for one event (CEP-22
// oversized transfer, which the SDK does by default), for
// internal/cli/contextvm_oversized_test.go to read with capvend's own
// ContextVM client:
//
//   node oversized-server.mjs <relay-url> [encryption: disabled|optional|required]
//
// Tools: bulk {kib} answers the text of example-tools' bulk (kib KiB:
// testnet/exampletools.BulkText); size {text} answers "<bytes> <sha256
// hex>" of the text. The key is $CONTEXTVM_SERVER_KEY (fresh when unset).
// Once subscribed it writes "READY <pubkey-hex>"; it runs until stdin
// closes or it gets SIGTERM/SIGINT.
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { NostrServerTransport, PrivateKeySigner } from '@contextvm/sdk';
import { createHash, randomBytes } from 'node:crypto';
import { z } from 'zod';

const [relay, encryption = 'optional'] = process.argv.slice(2);
if (!relay) {
  console.error('usage: node oversized-server.mjs <relay-url> [encryption]');
  process.exit(2);
}
const signer = new PrivateKeySigner(process.env.CONTEXTVM_SERVER_KEY || randomBytes(32).toString('hex'));

// testnet/exampletools' bulkBlock: 64 bytes of UTF-8.
const block = 'bulk "q" \\ <a&b>\t\n é€😀\u2028 0123456789abcdefghijklmnopqrstu\n';
const server = new McpServer({ name: 'sdk-oversized', version: '1.0.0' });
server.registerTool('bulk', {
  description: 'A text of kib KiB.',
  inputSchema: { kib: z.number().int().min(1).max(8192) },
}, async ({ kib }) => ({ content: [{ type: 'text', text: block.repeat(kib * 16) }] }));
server.registerTool('size', {
  description: 'The length in bytes and the SHA-256 of a text.',
  inputSchema: { text: z.string() },
}, async ({ text }) => ({ content: [{ type: 'text',
  text: `${Buffer.byteLength(text, 'utf8')} ${createHash('sha256').update(text, 'utf8').digest('hex')}` }] }));

const transport = new NostrServerTransport({
  signer,
  relayHandler: [relay],
  encryptionMode: encryption,
  serverInfo: { name: 'sdk-oversized' },
  // The SDK's default chunk size makes gift-wrapped frames over NIP-44's
  // 65535 bytes (it throws): 8000 works plain and encrypted.
  oversizedTransfer: { chunkSizeBytes: 8000 },
  logLevel: 'error',
});
const stop = async () => {
  try {
    await server.close();
  } finally {
    process.exit(0);
  }
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.stdin.on('end', stop);
process.stdin.resume();
try {
  await server.connect(transport);
  process.stdout.write(`READY ${await signer.getPublicKey()}\n`);
} catch (err) {
  console.error('contextvm server:', err && err.stack ? err.stack : err);
  process.exit(1);
}
