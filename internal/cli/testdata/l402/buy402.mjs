// A stock MCP client that pays an HTTP 402 with one of
// @getalby/lightning-tools' fetch wrappers: fetchWithL402, fetchWithMpp,
// fetchWithX402, or fetch402 (which takes whichever the server offers).
// The official MCP TypeScript SDK client over Streamable HTTP, its fetch
// wrapped by that function, whose WebLN-style wallet pays through an LND
// node's REST API. Nothing in it knows capvend.
//
// After the paid call it keeps the credential the library hands back
// (response.payment.credentials), as its README shows for a follow-up
// request, and presents it (never paying again) with the same call, the
// call with other arguments, and another tool: each must be refused.
//
//   node buy402.mjs <l402|mpp|x402|402> <mcp url> <tool> <arguments json> <other tool> <lnd rest host> <admin macaroon file>
//
// Run with NODE_EXTRA_CA_CERTS=<the node's tls.cert>. Prints one line per
// fact: RESULT <result json>, CREDENTIAL <header>, REFUSED <what> HTTP
// <status> <error> per refused presentation (RAN <what> if one ran), PREIMAGE
// <hex>, PAID <sats>.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { fetchWithL402 } from "@getalby/lightning-tools/402/l402";
import { fetchWithMpp } from "@getalby/lightning-tools/402/mpp";
import { fetchWithX402 } from "@getalby/lightning-tools/402/x402";
import { fetch402 } from "@getalby/lightning-tools/402";
import { lndRestWallet } from "./wallet.mjs";

const [which, url, tool, args, otherTool, restHost, macaroonFile] = process.argv.slice(2);
const wrappers = { l402: fetchWithL402, mpp: fetchWithMpp, x402: fetchWithX402, 402: fetch402 };
const pay = wrappers[which];
if (!pay) throw new Error(`unknown wrapper ${which}`);
const { wallet, paid } = lndRestWallet(restHost, macaroonFile);

let credentials;
const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: async (input, init) => {
    const resp = await pay(input.toString(), { ...init }, { wallet, credentials });
    if (resp.payment?.paid && resp.payment.credentials) {
      credentials = resp.payment.credentials;
    }
    return resp;
  },
});
const client = new Client({ name: `${which}-stock-client`, version: "1.0.0" });
await client.connect(transport);
const parsed = JSON.parse(args);
const result = await client.callTool({ name: tool, arguments: parsed });
console.log("RESULT " + JSON.stringify(result));
if (!credentials) throw new Error("no credential after the paid call");
console.log("CREDENTIAL " + credentials.header);

// The credential again: the same call, other arguments, another tool.
const other = Object.fromEntries(Object.entries(parsed).map(([k, v]) => [k, typeof v === "string" ? v + " (other)" : v]));
for (const [what, name, a] of [["replay", tool, parsed], ["other-arguments", tool, other], ["other-tool", otherTool, parsed]]) {
  try {
    const r = await client.callTool({ name, arguments: a });
    console.log(`RAN ${what} ` + JSON.stringify(r));
  } catch (e) {
    console.log(`REFUSED ${what} HTTP ${e.code} ` + String(e.message).replace(/\s+/g, " "));
  }
}
for (const p of paid.preimages) console.log("PREIMAGE " + p);
console.log("PAID " + paid.sats);
await client.close();
