// Package jsonobj reads the top-level members of a JSON object without
// decoding it, so that a member can be found, kept or cut out by slicing
// the bytes (the free-call fast path passes an upstream's result through
// this way instead of decoding and encoding it), and writes a JSON
// string as json.Marshal does without it for the plain ones (AppendString).
//
// Its functions expect valid JSON (checked by the caller, e.g. by the
// json.Unmarshal that found the object); on anything else they report
// false and the caller takes its slow path.
package jsonobj

// Member is one top-level member of an object: Key is the name as
// written between its quotes (without escapes, see Members), and
// b[Start:End] is the member from its opening quote to the end of its
// value; b[ValueStart:End] is the value.
type Member struct {
	Key        string
	Start      int
	ValueStart int
	End        int
}

// Members returns the top-level members of the object b, in order. It
// reports false when b is not an object, when a name holds a backslash
// escape (its decoded name would differ from its bytes), or when a name
// appears twice: callers then decode b the usual way.
func Members(b []byte) ([]Member, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, skipSpace(b, i+1) == len(b)
	}
	// Room for the members of the usual object at once, not growing
	// through 1, 2, 4 and 8.
	out := make([]Member, 0, 8)
	for i < len(b) {
		if b[i] != '"' {
			return nil, false
		}
		start := i
		end := skipString(b, i)
		key := b[i+1 : end-1]
		for _, c := range key {
			if c == '\\' {
				return nil, false
			}
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		vs := skipSpace(b, i+1)
		ve := skipValue(b, vs)
		if ve <= vs {
			return nil, false
		}
		for _, m := range out {
			if m.Key == string(key) {
				return nil, false
			}
		}
		out = append(out, Member{Key: keyString(key), Start: start, ValueStart: vs, End: ve})
		i = skipSpace(b, ve)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return out, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
	return nil, false
}

// Without returns the object b without the members cut (indexes into
// ms, b's members), written compactly between the members that stay; b
// itself if nothing is cut.
func Without(b []byte, ms []Member, cut ...int) []byte {
	if len(cut) == 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	out = append(out, '{')
	first := true
outer:
	for i, m := range ms {
		for _, c := range cut {
			if c == i {
				continue outer
			}
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, b[m.Start:m.End]...)
	}
	return append(out, '}')
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"').
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
		i++
	}
	return i
}

// Elements returns the values of the array b as [start, end) pairs of
// indexes into b; false if b is not an array.
func Elements(b []byte) ([][2]int, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	var out [][2]int
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, skipSpace(b, i+1) == len(b)
	}
	for i < len(b) {
		end := skipValue(b, i)
		if end <= i {
			return nil, false
		}
		out = append(out, [2]int{i, end})
		i = skipSpace(b, end)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return out, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
	return nil, false
}

// keyString is string(key), without allocating for the names JSON-RPC
// and MCP messages use on every call (a switch on string(key) does not
// copy key).
func keyString(key []byte) string {
	switch string(key) {
	case "jsonrpc":
		return "jsonrpc"
	case "id":
		return "id"
	case "method":
		return "method"
	case "params":
		return "params"
	case "result":
		return "result"
	case "error":
		return "error"
	case "name":
		return "name"
	case "arguments":
		return "arguments"
	case "_meta":
		return "_meta"
	case "progressToken":
		return "progressToken"
	case "content":
		return "content"
	case "type":
		return "type"
	case "text":
		return "text"
	case "isError":
		return "isError"
	case "resultType":
		return "resultType"
	case "structuredContent":
		return "structuredContent"
	case "io.modelcontextprotocol/protocolVersion":
		return "io.modelcontextprotocol/protocolVersion"
	case "io.modelcontextprotocol/clientInfo":
		return "io.modelcontextprotocol/clientInfo"
	case "io.modelcontextprotocol/clientCapabilities":
		return "io.modelcontextprotocol/clientCapabilities"
	case "io.modelcontextprotocol/serverInfo":
		return "io.modelcontextprotocol/serverInfo"
	}
	return string(key)
}
