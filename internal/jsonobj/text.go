package jsonobj

import "encoding/json"

// Plain reports whether s is printable ASCII without what json.Marshal
// escapes in a string (quote, backslash, <, >, &): the string's JSON is
// then s quoted.
func Plain[T string | []byte](s T) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// AppendString appends json.Marshal(s) to b, without json.Marshal when s
// is Plain.
func AppendString(b []byte, s string) []byte {
	if !Plain(s) {
		q, _ := json.Marshal(s)
		return append(b, q...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
