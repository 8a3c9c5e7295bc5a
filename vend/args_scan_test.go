package vend

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// FuzzArgsScanner: parseArgsObject (argsScanner for valid JSON) gives
// what json.Decoder's reading (decodeArgsObject) gives, values and error
// messages alike; encodeArgs writes what json.Encoder writes, and
// jsonschema reads that back as the parsed value (so the schema may
// validate the value, see callArgs); foldKey's ASCII shortcut folds as
// the rune loop.
func FuzzArgsScanner(f *testing.F) {
	deep := strings.Repeat(`{"a":`, maxArgsDepth) + `1` + strings.Repeat(`}`, maxArgsDepth)
	deepList := `{"a":` + strings.Repeat(`[`, maxArgsDepth) + strings.Repeat(`]`, maxArgsDepth) + `}`
	for _, s := range []string{
		`{"a":[1,2,{"b":null}]}`, `{"a":1,"A":2}`, `{"a":1.50e3,"s":"<\u00e9>"}`, `{"k":1,"K":2}`,
		`{"k":1,"` + "\u212a" + `":2}`, `{"s":1,"` + "\u017f" + `":2}`, `{"x":{"y":[0,{"z":1,"z":2}]}}`,
		`{"a":"\ud800"}`, "{\"a\":\"\xff\xfe\"}", "{\"\xff\":1,\"\xfe\":2}", `{"a\u0041":1,"aA":2}`,
		` { "a" : [ true , false , null , -0.5E+2 ] } `, "{}\u00a0", `[1]`, `"s"`, `12`, `{"a":1}x`,
		`{"a":}`, `{"a":"\"\\\/\b\f\n\r\t"}`, deep, deepList, `null`, ``, ` `, `{"":1,"":2}`, `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"A":0}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"I":0}`, `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"K":0,"k":1}`,
		`1e5`, `-0.0e-0`, `01`, `1.`, `-`, `.5`, `{"b":"\u2028\u2029<>&\u0007","a":["x\ny",1e400,-0]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, args string) {
		got, err := parseArgsObject(json.RawMessage(args))
		var want map[string]any
		var werr error
		switch strings.TrimSpace(args) {
		case "", "null":
			want = map[string]any{}
		default:
			want, werr = decodeArgsObject(json.RawMessage(args))
		}
		if (err == nil) != (werr == nil) || err != nil && err.Error() != werr.Error() {
			t.Fatalf("%q: error %v, the decoder's %v", args, err, werr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %#v, the decoder's %#v", args, got, want)
		}
		if err == nil {
			enc, err := encodeArgs(got)
			want, werr := encodeArgsJSON(got)
			if string(enc) != string(want) || (err == nil) != (werr == nil) {
				t.Fatalf("%q: encoded %s %v, the encoder's %s %v", args, enc, err, want, werr)
			}
			// The schema validates got as it would read enc (callArgs' inst).
			if inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(enc)); err != nil || !reflect.DeepEqual(inst, any(got)) {
				t.Fatalf("%q: encoded %s, read back by jsonschema as %#v (%v), not %#v", args, enc, inst, err, got)
			}
		}
		last := len(args) - 1 // a number ends with a digit, json.Valid allows spaces around it
		number := last >= 0 && (args[0] == '-' || '0' <= args[0] && args[0] <= '9') && '0' <= args[last] && args[last] <= '9' && json.Valid([]byte(args))
		if isJSONNumber(args) != number {
			t.Fatalf("isJSONNumber(%q) = %v", args, !number)
		}
		for _, k := range []string{args, strings.ToLower(args)} {
			if a, b := foldKey(k), foldRunes(k); a != b {
				t.Fatalf("foldKey(%q) = %q, the rune loop's %q", k, a, b)
			}
		}
	})
}

// foldRunes is foldKey without its ASCII shortcut.
func foldRunes(k string) string {
	var b []byte
	for _, r := range k {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		b = utf8.AppendRune(b, m)
	}
	return string(b)
}

// BenchmarkParseArgs: a call's arguments read by argsScanner ("scan") and
// by json.Decoder ("decoder", the reading before it), then encoded.
func BenchmarkParseArgs(b *testing.B) {
	raw := json.RawMessage(`{"text":"the quick brown fox","limit":10,"tags":["a","b"],"opts":{"lang":"en"}}`)
	for _, c := range []struct {
		name  string
		parse func(json.RawMessage) (map[string]any, error)
	}{{"scan", parseArgsObject}, {"decoder", decodeArgsObject}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m, err := c.parse(raw)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := encodeArgs(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
