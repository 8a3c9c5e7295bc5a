package vend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxArgsDepth bounds the nesting of an arguments object.
const maxArgsDepth = 128

// parseArgs parses a call's arguments once, strictly, and returns their one
// encoding: what is schema-validated, priced, hashed, stored and sent
// upstream. Absent or null arguments are {}. It refuses anything but a
// single JSON object, and any object (at any depth) with a duplicate key
// or with two keys that differ only in case: JSON parsers disagree on
// which of two such keys counts (the first, the last, a case-insensitive
// match), so a validator, a price rule and an upstream could each read a
// different one. The encoding is compact, with object keys sorted, and
// strings and numbers as the client spelled them (numbers are not
// rounded through floats).
func parseArgs(raw json.RawMessage) (json.RawMessage, error) {
	m, err := parseArgsObject(raw)
	if err != nil {
		return nil, err
	}
	return encodeArgs(m)
}

// parseArgsObject parses arguments as parseArgs does and returns the root
// object, to be encoded by encodeArgs.
//
// Valid JSON (every call's, but for a client's mistake) is read by
// argsScanner, off the bytes; anything else by decodeArgsObject, whose
// json.Decoder names the syntax error. Both give the same values and the
// same errors for valid JSON (FuzzArgsScanner): json.Decoder.Token makes
// and formats an error after every scalar it reads, and was the largest
// cost of a free call.
func parseArgsObject(raw json.RawMessage) (map[string]any, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return map[string]any{}, nil
	}
	if !json.Valid(raw) {
		return decodeArgsObject(raw)
	}
	sc := argsScanner{b: raw}
	sc.skipSpace()
	if raw[sc.i] != '{' {
		return nil, errors.New("arguments must be a JSON object")
	}
	sc.i++
	return sc.object(1)
}

// decodeArgsObject is parseArgsObject with json.Decoder (UseNumber): raw
// is not blank nor null.
func decodeArgsObject(raw json.RawMessage) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	if tok != json.Delim('{') {
		return nil, errors.New("arguments must be a JSON object")
	}
	v, err := parseObject(dec, "", 1)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("arguments must be a single JSON object (trailing data)")
	}
	return v, nil
}

// encodeArgs is parseArgs' one encoding of a parsed arguments object.
// It writes what json.Encoder (SetEscapeHTML(false)) writes, itself for
// what parseArgsObject makes (FuzzArgsScanner compares them), through
// the encoder for a string needing an escape or any other value.
func encodeArgs(v map[string]any) (json.RawMessage, error) {
	if b, ok := appendArgs(make([]byte, 0, 128), v); ok {
		return b, nil
	}
	return encodeArgsJSON(v)
}

// encodeArgsJSON is encodeArgs through json.Encoder.
func encodeArgsJSON(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("arguments: %v", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// parseValue parses the value starting with tok; at names where it is.
func parseValue(dec *json.Decoder, tok json.Token, at string, depth int) (any, error) {
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxArgsDepth {
			return nil, fmt.Errorf("arguments nest deeper than %d levels", maxArgsDepth)
		}
		if t == '{' {
			return parseObject(dec, at, depth+1)
		}
		list := []any{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
			}
			v, err := parseValue(dec, tok, fmt.Sprintf("%s/%d", at, len(list)), depth+1)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		if _, err := dec.Token(); err != nil { // ]
			return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
		}
		return list, nil
	default: // string, json.Number, bool, nil
		return t, nil
	}
}

// parseObject parses an object's members after its '{'.
func parseObject(dec *json.Decoder, at string, depth int) (map[string]any, error) {
	m := map[string]any{}
	folded := map[string]string{} // folded key -> the key as sent
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
		}
		k, ok := tok.(string)
		if !ok {
			return nil, errors.New("arguments are not valid JSON")
		}
		f := foldKey(k)
		if prev, dup := folded[f]; dup {
			if prev == k {
				return nil, fmt.Errorf("at %s: duplicate key %q", orRoot(at), k)
			}
			return nil, fmt.Errorf("at %s: keys %q and %q differ only in case", orRoot(at), prev, k)
		}
		folded[f] = k
		tok, err = dec.Token()
		if err != nil {
			return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
		}
		v, err := parseValue(dec, tok, at+"/"+k, depth)
		if err != nil {
			return nil, err
		}
		m[k] = v
	}
	if _, err := dec.Token(); err != nil { // }
		return nil, fmt.Errorf("arguments are not valid JSON: %v", err)
	}
	return m, nil
}

func orRoot(at string) string {
	if at == "" {
		return "/"
	}
	return at
}

// foldKey maps k to one representative of its case-folding class: two keys
// fold the same exactly when strings.EqualFold says they are equal (each
// rune is replaced by the smallest rune of its simple-folding orbit, as
// encoding/json's case-insensitive field matching folds them).
func foldKey(k string) string {
	ascii := true
	for i := 0; i < len(k) && ascii; i++ {
		ascii = k[i] < utf8.RuneSelf
	}
	if ascii {
		// An ASCII letter's orbit holds its upper case, the smallest
		// rune of it (k and s also hold U+212A and U+017F).
		return strings.ToUpper(k)
	}
	var b []byte
	for _, r := range k {
		min := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < min {
				min = f
			}
		}
		b = utf8.AppendRune(b, min)
	}
	return string(b)
}

// argsScanner reads valid JSON (json.Valid) as parseObject and parseValue
// read it through a json.Decoder with UseNumber: objects as
// map[string]any, arrays as []any, numbers as json.Number, strings
// decoded (invalid UTF-8 as U+FFFD), with the same refusals (duplicate
// keys, keys differing only in case, nesting deeper than maxArgsDepth)
// and messages. The path of a member, only needed in an error, is kept as
// segments (path) and joined only then.
type argsScanner struct {
	b    []byte
	i    int
	path []argsSeg
}

// argsSeg is one step of a path: a member's key, or an element's index.
type argsSeg struct {
	key string
	idx int // -1 for a key
}

// at is the path as parseObject names it: "/key/0/...".
func (sc *argsScanner) at() string {
	var b []byte
	for _, s := range sc.path {
		b = append(b, '/')
		if s.idx < 0 {
			b = append(b, s.key...)
		} else {
			b = strconv.AppendInt(b, int64(s.idx), 10)
		}
	}
	return string(b)
}

func (sc *argsScanner) skipSpace() {
	for sc.i < len(sc.b) {
		switch sc.b[sc.i] {
		case ' ', '\t', '\n', '\r':
			sc.i++
		default:
			return
		}
	}
}

// object reads an object's members after its '{' (parseObject).
func (sc *argsScanner) object(depth int) (map[string]any, error) {
	m := map[string]any{}
	var seen [smallObject]string // the first keys
	var folded map[string]string // folded key -> the key as sent, past smallObject keys
	n := 0
	for {
		sc.skipSpace()
		if sc.b[sc.i] == '}' {
			sc.i++
			return m, nil
		}
		if sc.b[sc.i] == ',' {
			sc.i++
			sc.skipSpace()
		}
		k := sc.str()
		// Up to smallObject keys are compared pairwise (EqualFold is
		// foldKey's equality, allocating nothing), then by folded key.
		prev, dup := "", false
		if n < smallObject {
			for _, p := range seen[:n] {
				if strings.EqualFold(p, k) {
					prev, dup = p, true
					break
				}
			}
			seen[n] = k
		} else {
			if n == smallObject {
				folded = make(map[string]string, 2*smallObject)
				for _, p := range seen {
					folded[foldKey(p)] = p
				}
			}
			f := foldKey(k)
			prev, dup = folded[f]
			folded[f] = k
		}
		if dup {
			at := orRoot(sc.at())
			if prev == k {
				return nil, fmt.Errorf("at %s: duplicate key %q", at, k)
			}
			return nil, fmt.Errorf("at %s: keys %q and %q differ only in case", at, prev, k)
		}
		n++
		sc.skipSpace()
		sc.i++ // ':'
		sc.skipSpace()
		sc.path = append(sc.path, argsSeg{key: k, idx: -1})
		v, err := sc.value(depth)
		if err != nil {
			return nil, err
		}
		sc.path = sc.path[:len(sc.path)-1]
		m[k] = v
	}
}

// smallObject is how many keys of an object argsScanner compares pairwise.
const smallObject = 8

// value reads the value at sc.i (parseValue).
func (sc *argsScanner) value(depth int) (any, error) {
	switch c := sc.b[sc.i]; c {
	case '{', '[':
		if depth >= maxArgsDepth {
			return nil, fmt.Errorf("arguments nest deeper than %d levels", maxArgsDepth)
		}
		sc.i++
		if c == '{' {
			return sc.object(depth + 1)
		}
		list := []any{}
		for {
			sc.skipSpace()
			if sc.b[sc.i] == ']' {
				sc.i++
				return list, nil
			}
			if sc.b[sc.i] == ',' {
				sc.i++
				sc.skipSpace()
			}
			sc.path = append(sc.path, argsSeg{idx: len(list)})
			v, err := sc.value(depth + 1)
			if err != nil {
				return nil, err
			}
			sc.path = sc.path[:len(sc.path)-1]
			list = append(list, v)
		}
	case '"':
		return sc.str(), nil
	case 't':
		sc.i += len("true")
		return true, nil
	case 'f':
		sc.i += len("false")
		return false, nil
	case 'n':
		sc.i += len("null")
		return nil, nil
	}
	start := sc.i
	for sc.i < len(sc.b) && isNumberByte(sc.b[sc.i]) {
		sc.i++
	}
	return json.Number(sc.b[start:sc.i]), nil
}

// str reads the string at sc.i, decoded as json.Unmarshal decodes it.
func (sc *argsScanner) str() string {
	start := sc.i
	sc.i++
	plain := true
	for {
		c := sc.b[sc.i]
		if c == '"' {
			break
		}
		if c == '\\' {
			plain = false
			sc.i++ // the escaped byte; a \u's hex digits are plain bytes
		} else if c >= utf8.RuneSelf {
			plain = false
		}
		sc.i++
	}
	sc.i++
	raw := sc.b[start:sc.i]
	if plain || (bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw)) {
		return string(raw[1 : len(raw)-1])
	}
	var s string
	_ = json.Unmarshal(raw, &s) // valid: it cannot fail
	return s
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// appendArgs appends v encoded as encodeArgsJSON would; false if v holds
// something it leaves to the encoder (then b is garbage).
func appendArgs(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case map[string]any:
		var buf [smallObject]string
		keys := buf[:0]
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendArgString(b, k); !ok {
				return b, false
			}
			b = append(b, ':')
			if b, ok = appendArgs(b, v[k]); !ok {
				return b, false
			}
		}
		return append(b, '}'), true
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendArgs(b, e); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case string:
		return appendArgString(b, v)
	case json.Number:
		if !isJSONNumber(string(v)) {
			return b, false // the encoder's "0" or its error
		}
		return append(b, v...), true
	case bool:
		return strconv.AppendBool(b, v), true
	case nil:
		return append(b, "null"...), true
	}
	return b, false
}

// appendArgString appends s as the encoder writes it: quoted as it is if
// it needs no escape (no control character, quote, backslash, invalid
// UTF-8, U+2028 or U+2029), else by the encoder.
func appendArgString(b []byte, s string) ([]byte, bool) {
	plain := utf8.ValidString(s)
	for i := 0; i < len(s) && plain; i++ {
		c := s[i]
		plain = c >= 0x20 && c != '"' && c != '\\' && c != 0xe2 // 0xe2 starts U+2028 and U+2029 (and others)
	}
	if !plain {
		e, err := encodeArgsJSON(s)
		return append(b, e...), err == nil
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// isJSONNumber reports whether s is a JSON number.
func isJSONNumber(s string) bool {
	i := 0
	digits := func() bool {
		start := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	return i == len(s)
}
