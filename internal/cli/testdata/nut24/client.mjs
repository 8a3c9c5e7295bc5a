// The stock MCP TypeScript SDK client paying `capvend serve` over HTTP 402
// with Cashu (NUT-24), run by internal/cli/nut24_test.go:
//
//   node client.mjs <mcp-url> <mint-url>
//
// The SDK's fetch is wrapped: on a 402 the wrapper decodes X-Cashu with
// cashu-ts (PaymentRequest.fromEncodedRequest), mints a token at the mint
// with cashu-ts (a mint quote's invoice is written to stdout as a line
// "PAY <bolt11>": the Go test pays it from the customer node) and retries
// the same request with X-Cashu: cashuB.... Tokens of its own choosing
// test the refusals. Results are lines "<WORD> <json>"; exits 0 after
// "DONE", 1 on any error.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { PaymentRequest, Wallet, getEncodedToken } from '@cashu/cashu-ts';

const [url, mintUrl] = process.argv.slice(2);
if (!url || !mintUrl) {
  console.error('usage: node client.mjs <mcp-url> <mint-url>');
  process.exit(2);
}
const out = (word, v) => process.stdout.write(`${word} ${JSON.stringify(v)}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const wallet = new Wallet(mintUrl, { unit: 'sat' });
await wallet.loadMint();

// mint returns fresh proofs worth amount sats, paid by the Go test. The
// mint quote is created and polled with plain NUT-04 requests: the
// regtest mint (gonuts v0.4.2) leaves "amount" out of its quote, which
// cashu-ts 4.8.0's createMintQuoteBolt11 refuses; the minting is
// cashu-ts's.
async function mint(amount) {
  const post = await fetch(`${mintUrl}/v1/mint/quote/bolt11`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ amount, unit: 'sat' }),
  });
  const q = await post.json();
  if (!post.ok || !q.quote || !q.request) throw new Error(`mint quote: ${JSON.stringify(q)}`);
  process.stdout.write(`PAY ${q.request}\n`);
  for (let i = 0; ; i++) {
    const s = await (await fetch(`${mintUrl}/v1/mint/quote/bolt11/${q.quote}`)).json();
    if (s.state === 'PAID') break;
    if (i === 600) throw new Error('mint quote never paid');
    await sleep(100);
  }
  return wallet.mintProofsBolt11(amount, q.quote);
}

const states = async (proofs) => (await wallet.checkProofsStates(proofs)).map((s) => s.state);

// payWith chooses the token of the next 402: a function of the decoded
// payment request, returning the token string.
let payWith = null;
const payingFetch = async (input, init) => {
  const res = await fetch(input, init);
  if (res.status !== 402) return res;
  const creq = res.headers.get('x-cashu');
  if (!creq || !payWith) return res;
  const pr = PaymentRequest.fromEncodedRequest(creq);
  out('CREQ', { amount: pr.amount.toNumber(), unit: pr.unit, mints: pr.mints, singleUse: pr.singleUse, transports: pr.transport ?? null });
  const headers = new Headers(init?.headers);
  headers.set('X-Cashu', await payWith(pr));
  return fetch(input, { ...init, headers });
};

const client = new Client({ name: 'capvend-nut24-interop', version: '1.0.0' });
let accepted = null; // the last notifications/payment_accepted's params
client.fallbackNotificationHandler = async (n) => {
  if (n.method === 'notifications/payment_accepted') accepted = n.params;
};
const call = (text) => client.callTool({ name: 't_sha256', arguments: { text } });
// refused runs a call whose payment must be refused with HTTP 400.
async function refused(word, text) {
  try {
    const res = await call(text);
    throw new Error(`${word}: not refused: ${JSON.stringify(res)}`);
  } catch (e) {
    if (e.code !== 400) throw e; // the SDK's StreamableHTTPError: the HTTP status
    out(word, `${e.code} ${e.message}`);
  }
}

try {
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { fetch: payingFetch }));

  // Too little: 10 sats for a 21-sat call. Refused, the proofs unspent.
  const low = await mint(10);
  payWith = (pr) => getEncodedToken({ mint: pr.mints[0], unit: pr.unit, proofs: low });
  await refused('UNDERPAID', 'paid over HTTP 402');
  out('UNDERPAID_STATES', await states(low));

  // Another mint: real proofs of this mint, named as another's; then
  // another unit. Refused, the proofs unspent.
  const foreign = await mint(21);
  payWith = (pr) => getEncodedToken({ mint: 'http://127.0.0.1:9/other-mint', unit: pr.unit, proofs: foreign });
  await refused('FOREIGN', 'paid over HTTP 402');
  // The same proofs, said to be in another unit.
  payWith = (pr) => getEncodedToken({ mint: pr.mints[0], unit: 'usd', proofs: foreign });
  await refused('UNIT', 'paid over HTTP 402');
  out('FOREIGN_STATES', await states(foreign));

  // Enough and more: 30 sats for 21. The call runs; the change comes
  // back in notifications/payment_accepted.
  const plenty = await mint(30);
  let paid = '';
  payWith = (pr) => (paid = getEncodedToken({ mint: pr.mints[0], unit: pr.unit, proofs: plenty }));
  const res = await call('paid over HTTP 402');
  out('RESULT', res.content?.[0]?.text ?? res);
  out('ACCEPTED', accepted);
  out('PAID_STATES', await states(plenty));

  // The spent token again, for a new call: refused.
  payWith = () => paid;
  await refused('DOUBLE', 'paid over HTTP 402 twice');

  // The earlier refused tokens still pay (nothing was burned).
  payWith = (pr) => getEncodedToken({ mint: pr.mints[0], unit: pr.unit, proofs: foreign });
  const again = await call('paid with the refused proofs');
  out('REUSED', again.content?.[0]?.text ?? again);
  out('DONE', true);
  await client.close();
  process.exit(0);
} catch (e) {
  console.error(e);
  process.exit(1);
}
