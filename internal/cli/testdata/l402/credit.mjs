// A stock MCP client that buys an L402 credit token and spends it: the
// official MCP TypeScript SDK client over Streamable HTTP, its fetch
// wrapped by @getalby/lightning-tools' fetchWithL402 (whose WebLN-style
// wallet pays through an LND node's REST API). It calls capvend_topup for
// N sats (the 402 is paid once), then keeps the credential the library
// hands back (response.payment.credentials) and passes it with every later
// request, as the library's README shows for reusing a paid credential:
// those calls pay nothing more. Nothing in it knows capvend's credit
// beyond the tool's name.
//
//   node credit.mjs <mcp url> <sats> <tool> <text> <calls> <lnd rest host> <admin macaroon file>
//
// Run with NODE_EXTRA_CA_CERTS=<the node's tls.cert>. Prints one line per
// fact: TOPUP <top-up result json>, RESULT <result json> per call (its
// arguments {"text": "<text> <i>"}), ERROR <message> for a refused call,
// PREIMAGE <hex> per payment, PAID <sats>.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { fetchWithL402 } from "@getalby/lightning-tools/402/l402";
import { lndRestWallet } from "./wallet.mjs";

const [url, sats, tool, text, calls, restHost, macaroonFile] = process.argv.slice(2);
const { wallet, paid } = lndRestWallet(restHost, macaroonFile);

// The credential of the one payment, reused for every later request.
let credentials;
const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: async (input, init) => {
    const resp = await fetchWithL402(input.toString(), { ...init }, { wallet, credentials });
    if (resp.payment?.paid && resp.payment.credentials) {
      credentials = resp.payment.credentials;
    }
    return resp;
  },
});
const client = new Client({ name: "l402-credit-client", version: "1.0.0" });
await client.connect(transport);
const topUp = await client.callTool({ name: "capvend_topup", arguments: { sats: Number(sats) } });
console.log("TOPUP " + JSON.stringify(topUp));
for (let i = 0; i < Number(calls); i++) {
  try {
    const result = await client.callTool({ name: tool, arguments: { text: `${text} ${i}` } });
    console.log("RESULT " + JSON.stringify(result));
  } catch (e) {
    console.log("ERROR " + String(e.message ?? e).replaceAll("\n", " "));
  }
}
for (const p of paid.preimages) console.log("PREIMAGE " + p);
console.log("PAID " + paid.sats);
await client.close();
