// A stock MCP client that pays with L402: the official MCP TypeScript SDK
// client over Streamable HTTP, its fetch wrapped by @getalby/lightning-tools'
// fetchWithL402, whose WebLN-style wallet pays through an LND node's REST
// API. Nothing in it knows capvend.
//
//   node client.mjs <mcp url> <tool> <arguments json> <lnd rest host> <admin macaroon file>
//
// Run with NODE_EXTRA_CA_CERTS=<the node's tls.cert>. Prints one line per
// fact: RESULT <text of the tool result>, PREIMAGE <hex>, PAID <sats>.
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { fetchWithL402 } from "@getalby/lightning-tools/402/l402";

const [url, tool, args, restHost, macaroonFile] = process.argv.slice(2);
const macaroon = readFileSync(macaroonFile).toString("hex");

// The wallet: pay a bolt11 from the LND node over REST (SendPaymentSync).
const preimages = [];
let paidSats = 0;
const wallet = {
  async payInvoice({ invoice }) {
    const resp = await fetch(`https://${restHost}/v1/channels/transactions`, {
      method: "POST",
      headers: { "Grpc-Metadata-macaroon": macaroon, "Content-Type": "application/json" },
      body: JSON.stringify({ payment_request: invoice, fee_limit: { fixed: 100 } }),
    });
    const body = await resp.json();
    if (!resp.ok || body.payment_error) {
      throw new Error(`lnd REST: ${resp.status} ${JSON.stringify(body)}`);
    }
    const preimage = Buffer.from(body.payment_preimage, "base64").toString("hex");
    preimages.push(preimage);
    paidSats += Number(body.payment_route?.total_amt ?? 0);
    return { preimage, fees_paid: Number(body.payment_route?.total_fees_msat ?? 0) };
  },
};

const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: (input, init) => fetchWithL402(input.toString(), { ...init }, { wallet }),
});
const client = new Client({ name: "l402-stock-client", version: "1.0.0" });
await client.connect(transport);
const result = await client.callTool({ name: tool, arguments: JSON.parse(args) });
console.log("RESULT " + JSON.stringify(result));
for (const p of preimages) console.log("PREIMAGE " + p);
console.log("PAID " + paidSats);
await client.close();
