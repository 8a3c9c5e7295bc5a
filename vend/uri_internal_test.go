package vend

import "testing"

func TestNormalURI(t *testing.T) {
	for _, tc := range []struct{ in, normal, folded string }{
		{"file:///docs/guide", "file:///docs/guide", "file:///docs/guide"},
		{"file:///docs/./guide", "file:///docs/guide", "file:///docs/guide"},
		{"file:///docs/x/../guide", "file:///docs/guide", "file:///docs/guide"},
		{"file:///../../etc/passwd", "file:///etc/passwd", "file:///etc/passwd"},
		{"file:///docs/%2E%2E/x", "file:///x", "file:///x"},
		{"file:///%7Euser/%41b%2f", "file:///~user/Ab%2F", "file:///~user/Ab/"},
		{"FILE://Example.COM/A", "file://example.com/A", "file://example.com/A"},
		{"http://User@Example.com:80/a?Q=%2e#F", "http://User@example.com:80/a?Q=.#F", "http://User@example.com:80/a?Q=.#F"},
		{"file:///private//secret", "file:///private//secret", "file:///private/secret"},
		{"file:////private/secret", "file:////private/secret", "file:///private/secret"},
		{"file:///a%2F..%2Fb", "file:///a%2F..%2Fb", "file:///b"},
		{`file:///a\..\b`, `file:///a\..\b`, "file:///b"},
		{"urn:isbn:0451450523", "urn:isbn:0451450523", "urn:isbn:0451450523"},
		{"s:/..//x", "s:/.//x", "s:/x"},
		{"docs://pages/{id}", "docs://pages/{id}", "docs://pages/{id}"},
		{"100%", "100%", "100%"},
		{"", "", ""},
	} {
		if got := normalURI(tc.in); got != tc.normal {
			t.Errorf("normalURI(%q) = %q, want %q", tc.in, got, tc.normal)
		}
		if got := foldedURI(tc.in); got != tc.folded {
			t.Errorf("foldedURI(%q) = %q, want %q", tc.in, got, tc.folded)
		}
	}
}

// FuzzNormalURI: a client's URI never panics the normalization, whose
// forms are fixed points.
func FuzzNormalURI(f *testing.F) {
	for _, s := range []string{"file:///a/./b/../c", "http://H/%2e%2E/%7e", "s:/..//x", `x:\..\%2F//y`, "%", "a:b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		n := normalURI(uri)
		if again := normalURI(n); again != n {
			t.Fatalf("normalURI(%q) = %q, but normalURI of that is %q", uri, n, again)
		}
		fo := foldedURI(uri)
		if again := foldedURI(fo); again != fo {
			t.Fatalf("foldedURI(%q) = %q, but foldedURI of that is %q", uri, fo, again)
		}
	})
}
