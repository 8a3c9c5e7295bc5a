package rpcerr

import "github.com/capvend/capvend/vend"

// withRefund adds a refunded call's refund to its error's data, under
// "refund": the Cashu token that pays it back, or that it is owed (with
// its id, to claim it).
func withRefund(e Error, r vend.RefundInfo) Error {
	data, ok := e.Data.(map[string]any)
	if !ok {
		data = map[string]any{}
	}
	data["refund"] = r
	e.Data = data
	return e
}
