package vend

import "strings"

// Resource URIs are read as the client spells them, once they are in
// normal form: normalURI(uri) == uri, or the upstream lists uri as it is
// (a resource or a template). Any other spelling (dot segments, a
// percent-encoded unreserved character, lower-case hex, an upper-case
// scheme or host) is refused as invalid params naming the normal form,
// so that what is priced, recorded and sent upstream is what the client
// asked for, and no other spelling of a priced URI reaches a free
// template. Spellings RFC 3986 calls distinct but many servers read
// alike (empty path segments, a percent-encoded '/' or '\') are read as
// spelled, and priced at least as their folded form (foldedURI): the
// price keys that match either spelling compete.

// normalURI returns uri in the normal form of RFC 3986 section 6.2.2
// (syntax-based): percent-encodings with upper-case hex, those of
// unreserved characters decoded; scheme and host in lower case; dot
// segments removed from the path. Anything it cannot parse is kept as it
// is.
func normalURI(uri string) string {
	// A stray '%' before a decoded one makes a new encoding: again, until
	// none is left (each decoding shortens uri).
	for n := normalPercent(uri); n != uri; n = normalPercent(uri) {
		uri = n
	}
	scheme, authority, path, tail, hasAuthority := splitURI(uri)
	path = removeDotSegments(path)
	path = keepShape(scheme, path, hasAuthority)
	return joinURI(strings.ToLower(scheme), lowerHost(authority), path, tail, hasAuthority)
}

// keepShape keeps a path whose dot segments were removed from reading as
// something else: "//x" without an authority as an authority (it becomes
// "/.//x", as the WHATWG URL standard writes it), "a:b" without a scheme
// as a scheme (it becomes "./a:b", as RFC 3986 section 4.2 writes it).
func keepShape(scheme, path string, hasAuthority bool) string {
	switch {
	case hasAuthority:
	case strings.HasPrefix(path, "//"):
		return "/." + path
	case scheme == "":
		if seg, _, _ := strings.Cut(path, "/"); strings.Contains(seg, ":") {
			return "./" + path
		}
	}
	return path
}

// foldedURI returns normalURI(uri) with its path's encoded slashes and
// backslashes (%2F, %5C, \) made '/', its empty segments dropped, and
// dot segments removed again: the resource many servers read uri as.
func foldedURI(uri string) string {
	scheme, authority, path, tail, hasAuthority := splitURI(normalURI(uri))
	path = strings.NewReplacer("%2F", "/", "%5C", "/", `\`, "/").Replace(path)
	for strings.Contains(path, "//") {
		path = strings.ReplaceAll(path, "//", "/")
	}
	return joinURI(scheme, authority, keepShape(scheme, removeDotSegments(path), hasAuthority), tail, hasAuthority)
}

// splitURI splits uri into its scheme (without ':'; "" if it has none),
// authority (without "//"), path, and the rest (query and fragment, with
// their '?' or '#').
func splitURI(uri string) (scheme, authority, path, tail string, hasAuthority bool) {
	rest := uri
	if i := strings.IndexByte(uri, ':'); i > 0 && isScheme(uri[:i]) {
		scheme, rest = uri[:i], uri[i+1:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest, tail = rest[:i], rest[i:]
	}
	if a, ok := strings.CutPrefix(rest, "//"); ok {
		hasAuthority = true
		authority, path = a, ""
		if i := strings.IndexByte(a, '/'); i >= 0 {
			authority, path = a[:i], a[i:]
		}
		return scheme, authority, path, tail, hasAuthority
	}
	return scheme, "", rest, tail, false
}

func joinURI(scheme, authority, path, tail string, hasAuthority bool) string {
	var b strings.Builder
	if scheme != "" {
		b.WriteString(scheme + ":")
	}
	if hasAuthority {
		b.WriteString("//" + authority)
	}
	b.WriteString(path)
	b.WriteString(tail)
	return b.String()
}

// isScheme reports whether s is an RFC 3986 scheme: a letter, then
// letters, digits, '+', '-', '.'.
func isScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// lowerHost lower-cases the host of an authority, not its user info.
func lowerHost(authority string) string {
	i := strings.LastIndexByte(authority, '@')
	return authority[:i+1] + strings.ToLower(authority[i+1:])
}

// normalPercent decodes the percent-encodings of unreserved characters
// and writes the others' hex in upper case; a '%' without two hex digits
// is kept.
func normalPercent(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' || i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			b.WriteByte(s[i])
			continue
		}
		c := unhex(s[i+1])<<4 | unhex(s[i+2])
		if isUnreserved(c) {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(s[i+1:i+3]))
		}
		i += 2
	}
	return b.String()
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

func isUnreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// removeDotSegments is RFC 3986 section 5.2.4.
func removeDotSegments(in string) string {
	if !strings.Contains(in, ".") {
		return in
	}
	out := make([]byte, 0, len(in))
	up := func() {
		if i := strings.LastIndexByte(string(out), '/'); i >= 0 {
			out = out[:i]
		} else {
			out = out[:0]
		}
	}
	for in != "" {
		switch {
		case strings.HasPrefix(in, "../"):
			in = in[3:]
		case strings.HasPrefix(in, "./"):
			in = in[2:]
		case strings.HasPrefix(in, "/./"):
			in = in[2:]
		case in == "/.":
			in = "/"
		case strings.HasPrefix(in, "/../"):
			in = in[3:]
			up()
		case in == "/..":
			in = "/"
			up()
		case in == "." || in == "..":
			in = ""
		default:
			j := strings.IndexByte(in[1:], '/')
			if j < 0 {
				out, in = append(out, in...), ""
			} else {
				out, in = append(out, in[:j+1]...), in[j+1:]
			}
		}
	}
	return string(out)
}
