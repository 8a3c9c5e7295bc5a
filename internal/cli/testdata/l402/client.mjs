// A stock MCP client that pays with L402: the official MCP TypeScript SDK
// client over Streamable HTTP, its fetch wrapped by @getalby/lightning-tools'
// fetchWithL402, whose WebLN-style wallet pays through an LND node's REST
// API. Nothing in it knows capvend.
//
//   node client.mjs <mcp url> <tool> <arguments json> <lnd rest host> <admin macaroon file>
//
// Run with NODE_EXTRA_CA_CERTS=<the node's tls.cert>. Prints one line per
// fact: RESULT <text of the tool result>, PREIMAGE <hex>, PAID <sats>.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { fetchWithL402 } from "@getalby/lightning-tools/402/l402";
import { lndRestWallet } from "./wallet.mjs";

const [url, tool, args, restHost, macaroonFile] = process.argv.slice(2);
const { wallet, paid } = lndRestWallet(restHost, macaroonFile);

const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: (input, init) => fetchWithL402(input.toString(), { ...init }, { wallet }),
});
const client = new Client({ name: "l402-stock-client", version: "1.0.0" });
await client.connect(transport);
const result = await client.callTool({ name: tool, arguments: JSON.parse(args) });
console.log("RESULT " + JSON.stringify(result));
for (const p of paid.preimages) console.log("PREIMAGE " + p);
console.log("PAID " + paid.sats);
await client.close();
