package upstream

import (
	"bytes"
	"testing"
)

// FuzzResponseResult: reading a response off the bytes gives what
// json.Unmarshal gives (decodeResponse): the same result bytes, or an
// error as well.
func FuzzResponseResult(f *testing.F) {
	for _, s := range []string{`{"jsonrpc":"2.0","id":"capvend-raw-1","result":{"content":[]}}`,
		`{"id":"capvend-raw-1","result":null}`, `{"jsonrpc":"2.0","id":"capvend-raw-2","result":{}}`,
		`{"jsonrpc":"2.0","id":"capvend-raw-1","error":{"code":-32602,"message":"bad"}}`,
		`{"jsonrpc":"2.0","ID":"capvend-raw-1","result":{}}`, `{"id":"capvend-raw-1","Result":1,"result":2}`,
		` { "id" : "capvend-raw-1" , "result" : [ 1 , 2 ] } `, `{"id":"capvend-raw-1"}`, `[]`, `{`, `{"id":"capvend-raw-1","result":1,"result":2}`,
		`{"i\u0064":"capvend-raw-1","result":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := responseResult([]byte(s), `"capvend-raw-1"`)
		want, werr := decodeResponse([]byte(s), `"capvend-raw-1"`)
		if (err == nil) != (werr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("%s: %s %v, json.Unmarshal: %s %v", s, got, err, want, werr)
		}
	})
}
