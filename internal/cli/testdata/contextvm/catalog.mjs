// The stock @contextvm/sdk client reading `capvend serve`'s prompts and
// resources over ContextVM, run by internal/cli/contextvm_test.go:
//
//   node catalog.mjs <relay-url> <server-pubkey-hex> <prompt> <text> <resource-uri>
//
// It lists the prompts, gets <prompt> with {text}, lists the resources
// and templates, and reads <resource-uri>; the SDK validates each result.
// What it saw is written as lines "<WORD> <json>". Exits 0 after "DONE",
// 1 on any error.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { NostrClientTransport } from '@contextvm/sdk';
import { randomBytes } from 'node:crypto';

const [relay, serverPubkey, prompt, text, uri] = process.argv.slice(2);
if (!uri) {
  console.error('usage: node catalog.mjs <relay-url> <server-pubkey-hex> <prompt> <text> <resource-uri>');
  process.exit(2);
}
const out = (word, v) => process.stdout.write(`${word} ${JSON.stringify(v)}\n`);

const transport = new NostrClientTransport({
  signer: randomBytes(32).toString('hex'),
  relayHandler: [relay],
  serverPubkey,
  encryptionMode: 'optional',
  logLevel: 'error',
});
const client = new Client({ name: 'capvend-contextvm-catalog', version: '1.0.0' });
const timeout = { timeout: 60_000 };

try {
  await client.connect(transport, timeout);
  out('CAPS', client.getServerCapabilities());
  out('PROMPTS', (await client.listPrompts(undefined, timeout)).prompts);
  out('PROMPT', await client.getPrompt({ name: prompt, arguments: { text } }, timeout));
  out('RESOURCES', (await client.listResources(undefined, timeout)).resources);
  out('TEMPLATES', (await client.listResourceTemplates(undefined, timeout)).resourceTemplates);
  out('READ', await client.readResource({ uri }, timeout));
  out('DONE', true);
  await client.close();
  process.exit(0);
} catch (err) {
  console.error('contextvm catalog client:', err && err.stack ? err.stack : err);
  process.exit(1);
}
