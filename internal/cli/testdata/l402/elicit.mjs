// A stock MCP client that pays through URL-mode elicitation (MCP
// 2025-11-25): the official MCP TypeScript SDK client over Streamable
// HTTP, declaring elicitation {url: {}}. When the server asks it to open a
// URL, it does what a person would: it opens the page, reads the invoice
// shown there and pays it from an LND node (REST). It calls the tool once
// and never retries. Nothing in it knows capvend beyond what the page
// shows.
//
//   node elicit.mjs <mcp url> <tool> <arguments json> <lnd rest host> <admin macaroon file>
//
// Prints: ELICIT <mode> <url>, COMPLETE <elicitation id>, RESULT <result
// json>, CALLS <tools/call requests sent>, PREIMAGE <hex>, PAID <sats>.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema, ElicitationCompleteNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { lndRestWallet } from "./wallet.mjs";

const [url, tool, args, restHost, macaroonFile] = process.argv.slice(2);
const { wallet, paid } = lndRestWallet(restHost, macaroonFile);

let calls = 0;
let paying = Promise.resolve();
const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: (input, init) => {
    if (typeof init?.body === "string" && init.body.includes('"tools/call"')) calls++;
    return fetch(input, init);
  },
});
const client = new Client({ name: "url-elicitation-client", version: "1.0.0" }, { capabilities: { elicitation: { url: {} } } });
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  console.log(`ELICIT ${req.params.mode} ${req.params.url}`);
  // The person opens the page and pays the invoice it shows.
  paying = (async () => {
    const page = await (await fetch(req.params.url)).text();
    const m = /<code id="invoice">([^<]+)<\/code>/.exec(page);
    if (!m) throw new Error("no invoice on the page");
    await wallet.payInvoice({ invoice: m[1] });
  })();
  return { action: "accept" };
});
client.setNotificationHandler(ElicitationCompleteNotificationSchema, (n) => {
  console.log("COMPLETE " + n.params.elicitationId);
});
await client.connect(transport);
const result = await client.callTool({ name: tool, arguments: JSON.parse(args) });
await paying;
console.log("RESULT " + JSON.stringify(result));
console.log("CALLS " + calls);
for (const p of paid.preimages) console.log("PREIMAGE " + p);
console.log("PAID " + paid.sats);
await client.close();
