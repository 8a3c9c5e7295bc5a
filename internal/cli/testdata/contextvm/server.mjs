// A stock @contextvm/sdk server (NostrServerTransport + the MCP SDK's
// McpServer) exposing one free tool, word_count, with the semantics of
// cmd/example-tools' word_count. internal/cli/bench_nostr_test.go runs it
// next to capvend's ContextVM front on the same relay:
//
//   node server.mjs <relay-url> [encryption: disabled|optional|required]
//
// The secret key (64 hex) is read from $CONTEXTVM_SERVER_KEY (fresh when
// unset). Once subscribed it writes "READY <pubkey-hex>" to stdout; it
// runs until stdin closes or it gets SIGTERM/SIGINT.
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { NostrServerTransport, PrivateKeySigner } from '@contextvm/sdk';
import { randomBytes } from 'node:crypto';
import { z } from 'zod';

const [relay, encryption = 'optional'] = process.argv.slice(2);
if (!relay) {
  console.error('usage: node server.mjs <relay-url> [encryption]');
  process.exit(2);
}
const key = process.env.CONTEXTVM_SERVER_KEY || randomBytes(32).toString('hex');
const signer = new PrivateKeySigner(key);

const server = new McpServer({ name: 'sdk-word-count', version: '1.0.0' });
server.registerTool('word_count', {
  description: 'Count the words, lines and characters of a text.',
  inputSchema: { text: z.string().max(1 << 20).describe('the text') },
}, async ({ text }) => {
  // As example-tools: whitespace-separated fields, lines (a last one
  // without a newline counts), characters as code points.
  const words = text.split(/\s+/).filter((w) => w !== '').length;
  let lines = text.split('\n').length - 1;
  if (text !== '' && !text.endsWith('\n')) lines++;
  const chars = [...text].length;
  return { content: [{ type: 'text', text: `${words} words, ${lines} lines, ${chars} characters` }] };
});

const transport = new NostrServerTransport({
  signer,
  relayHandler: [relay],
  encryptionMode: encryption,
  serverInfo: { name: 'sdk-word-count' },
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
