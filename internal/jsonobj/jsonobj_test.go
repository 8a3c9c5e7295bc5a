package jsonobj

import (
	"encoding/json"
	"reflect"
	"testing"
)

var objects = []string{
	`{}`, ` { } `, `{"a":1}`, `{"a" : 1 , "b":"x,}]\"{" ,"c":[1,{"d":"]"}],"e":{"f":[]}}`,
	`{"content":[{"type":"text","text":"the \"quick\" fox"}],"resultType":"complete","_meta":{"serverInfo":{"name":"x","version":"1"}}}`,
	`{"n":-1.5e+3,"t":true,"f":false,"z":null}`, "{\n\t\"a\"\r\n:\n\"b\"\n}\n",
}

// TestMembersAsDecoder: Members finds the members encoding/json finds,
// with the same raw values, and Without cuts exactly the members asked.
func TestMembersAsDecoder(t *testing.T) {
	for _, in := range objects {
		ms, ok := Members([]byte(in))
		if !ok {
			t.Errorf("%s: not read", in)
			continue
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		got := map[string]json.RawMessage{}
		for _, m := range ms {
			got[m.Key] = json.RawMessage(in[m.ValueStart:m.End])
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: members %q, want %q", in, got, want)
		}
		for i := range ms {
			cut := Without([]byte(in), ms, i)
			var rest map[string]json.RawMessage
			if err := json.Unmarshal(cut, &rest); err != nil {
				t.Fatalf("%s without %s: %s: %v", in, ms[i].Key, cut, err)
			}
			delete(want, ms[i].Key)
			if len(rest) != len(want) {
				t.Errorf("%s without %s: %s", in, ms[i].Key, cut)
			}
			for k, v := range want {
				if string(rest[k]) != string(v) {
					t.Errorf("%s without %s: %s", in, ms[i].Key, cut)
				}
			}
			want[ms[i].Key] = got[ms[i].Key]
		}
		if string(Without([]byte(in), ms)) != in {
			t.Errorf("%s: Without nothing changed it", in)
		}
	}
}

// TestMembersRefuses: what the decoder would read differently from the
// bytes (escaped names, repeated names) and what is not an object.
func TestMembersRefuses(t *testing.T) {
	for _, in := range []string{`[]`, `"x"`, `1`, ``, `{"a\u0062":1}`, `{"a":1,"a":2}`, `{"a":1}x`, `{"a":1,}`, `{"a"}`} {
		if _, ok := Members([]byte(in)); ok {
			t.Errorf("%s: read", in)
		}
	}
}

// TestElementsAsDecoder: Elements finds the values encoding/json finds.
func TestElementsAsDecoder(t *testing.T) {
	for _, in := range []string{`[]`, ` [ ] `, `[1]`, `[ "a,]" , {"b":[1,2]},[[]],null ]`, "[\n1\n,\t2]"} {
		es, ok := Elements([]byte(in))
		if !ok {
			t.Errorf("%s: not read", in)
			continue
		}
		var want []json.RawMessage
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		var got []json.RawMessage
		for _, e := range es {
			got = append(got, json.RawMessage(in[e[0]:e[1]]))
		}
		if len(got) != len(want) {
			t.Errorf("%s: %q, want %q", in, got, want)
			continue
		}
		for i := range got {
			if string(got[i]) != string(want[i]) {
				t.Errorf("%s: %q, want %q", in, got, want)
			}
		}
	}
	for _, in := range []string{`{}`, `[1,]`, `[1 2]`, `[1]x`} {
		if _, ok := Elements([]byte(in)); ok {
			t.Errorf("%s: read", in)
		}
	}
}

// BenchmarkMembers reads a tools/call request's top level as the fast
// path does, once per call.
func BenchmarkMembers(b *testing.B) {
	req := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"_meta":{"progressToken":1},"arguments":{"text":"the quick brown fox"},"name":"w_word_count"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := Members(req); !ok {
			b.Fatal("not an object")
		}
	}
}

// The names of a free call's request and result are read without an
// allocation each (keyString); the only one is Members' slice.
func TestMembersCallNamesAllocateOnce(t *testing.T) {
	for _, b := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`,
		`{"name":"x","arguments":{},"_meta":{}}`,
		`{"progressToken":1,"io.modelcontextprotocol/protocolVersion":"v","io.modelcontextprotocol/clientInfo":{},"io.modelcontextprotocol/clientCapabilities":{}}`,
		`{"content":[],"isError":false,"structuredContent":{},"resultType":"complete","_meta":{"io.modelcontextprotocol/serverInfo":{}}}`,
	} {
		bb := []byte(b)
		if n := testing.AllocsPerRun(10, func() { _, _ = Members(bb) }); n != 1 {
			t.Errorf("%s: %v allocations, want 1", b, n)
		}
	}
}

// FuzzAppendString: AppendString writes what json.Marshal writes, and
// Plain strings are their JSON quoted.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"word_count", "a<b", `q"`, "é", "\x00", "a\\b", "\u2028", "\xff", "a&b", "~ !"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := AppendString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("%q: %s, json.Marshal: %s", s, got[1:], want)
		}
		if Plain(s) && string(want) != `"`+s+`"` {
			t.Fatalf("Plain(%q), but json.Marshal gives %s", s, want)
		}
	})
}
