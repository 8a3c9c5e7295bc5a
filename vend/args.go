package vend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
func parseArgsObject(raw json.RawMessage) (map[string]any, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return map[string]any{}, nil
	}
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
func encodeArgs(v map[string]any) (json.RawMessage, error) {
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
