// The WebLN-style wallet both stock clients hand to fetchWithL402: it pays
// a bolt11 from an LND node over its REST API (SendPaymentSync), and
// keeps the preimages and the sats it paid, for the client to print.
import { readFileSync } from "node:fs";

export function lndRestWallet(restHost, macaroonFile) {
  const macaroon = readFileSync(macaroonFile).toString("hex");
  const paid = { preimages: [], sats: 0 };
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
      paid.preimages.push(preimage);
      paid.sats += Number(body.payment_route?.total_amt ?? 0);
      return { preimage, fees_paid: Number(body.payment_route?.total_fees_msat ?? 0) };
    },
  };
  return { wallet, paid };
}
