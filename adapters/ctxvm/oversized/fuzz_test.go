package oversized

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzParse: the frame parser never panics on untrusted params, and a
// frame it accepts encodes back to params it reads as the same frame; a
// receiver given it never panics either.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"progressToken":"1","progress":1,"message":"m","cvm":{"type":"oversized-transfer","frameType":"start","completionMode":"render","digest":"` + Digest([]byte("x")) + `","totalBytes":1,"totalChunks":1}}`,
		`{"progressToken":1,"progress":2,"cvm":{"type":"oversized-transfer","frameType":"chunk","data":"x\"é"}}`,
		`{"progressToken":"t","progress":3,"cvm":{"type":"oversized-transfer","frameType":"end"}}`,
		`{"progressToken":"t","progress":9,"cvm":{"type":"oversized-transfer","frameType":"abort","reason":"r"}}`,
		`{"progressToken":1e3,"progress":2,"cvm":{"type":"oversized-transfer","frameType":"accept"}}`,
		`{"progressToken":"t","progress":-1,"cvm":{}}`,
	} {
		f.Add([]byte(s))
	}
	r := NewReceiver(Policy{MaxBytes: 1 << 10, MaxChunks: 16, Window: 4})
	f.Fuzz(func(t *testing.T, params []byte) {
		fr, err := Parse(json.RawMessage(params))
		if err != nil {
			return
		}
		again, err := Parse(fr.Params())
		if err != nil {
			t.Fatalf("%s parsed, its encoding %s did not: %v", params, fr.Params(), err)
		}
		if string(again.Params()) != string(fr.Params()) {
			t.Fatalf("round trip changed the frame: %s -> %s", fr.Params(), again.Params())
		}
		_, _ = r.Add("peer", fr, true, time.Now(), nil)
		r.Sweep(time.Now().Add(time.Hour))
	})
}
