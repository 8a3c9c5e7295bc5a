package vend

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// CanonicalHash returns the hex SHA-256 of the canonical JSON form of
// {"method": method, "params": params} with params' top-level "_meta"
// removed. Two requests that differ only in key order, white space, number
// spelling of the same number, or _meta hash the same; this is the key a paid
// grant is bound to.
func CanonicalHash(method string, params json.RawMessage) (string, error) {
	var p any
	if len(bytes.TrimSpace(params)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(params))
		dec.UseNumber()
		if err := dec.Decode(&p); err != nil {
			return "", fmt.Errorf("params: %w", err)
		}
		if dec.More() {
			return "", fmt.Errorf("params: trailing data after JSON value")
		}
	}
	if m, ok := p.(map[string]any); ok {
		delete(m, "_meta")
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, map[string]any{"method": method, "params": p}); err != nil {
		return "", err
	}
	sum := sha256.Sum256(b.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// canonicalNumber spells a JSON number exactly and uniquely: an integer
// value in plain decimal ("2", "2.0", "2e0" are all "2"), anything else as
// its reduced fraction ("0.5" is "1/2"). Exponents beyond +-400 are refused
// rather than expanded.
func canonicalNumber(lit string) (string, error) {
	if i := strings.IndexAny(lit, "eE"); i >= 0 {
		exp, err := strconv.Atoi(lit[i+1:])
		if err != nil || exp > 400 || exp < -400 {
			return "", fmt.Errorf("number %s is out of range", lit)
		}
	}
	r, ok := new(big.Rat).SetString(lit)
	if !ok {
		return "", fmt.Errorf("number %q is not valid", lit)
	}
	if r.IsInt() {
		return r.Num().String(), nil
	}
	return r.String(), nil
}

// writeCanonical writes v with object keys sorted, no insignificant white
// space, and integers in plain decimal form.
func writeCanonical(b *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case string:
		enc, _ := json.Marshal(t) // strings always marshal
		b.Write(enc)
	case json.Number:
		c, err := canonicalNumber(string(t))
		if err != nil {
			return err
		}
		b.WriteString(c)
	case []any:
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			enc, _ := json.Marshal(k)
			b.Write(enc)
			b.WriteByte(':')
			if err := writeCanonical(b, t[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}
