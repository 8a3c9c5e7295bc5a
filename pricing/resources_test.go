package pricing

import (
	"slices"
	"testing"
)

func TestCompareSpecificity(t *testing.T) {
	// Most specific first.
	want := []string{
		"docs://a/special",      // a URI: all literal
		"docs://{kind}/special", // 15 literal characters
		"docs://a/{x}",          // 9, one expression
		"docs://a{x}{y}",        // 8, two
		"docs://{+path}",        // 7
		"docs://{a}{b}",         // 7, two
	}
	got := slices.Clone(want)
	slices.Reverse(got)
	slices.SortFunc(got, CompareSpecificity)
	if !slices.Equal(got, want) {
		t.Fatalf("sorted %q\nwant   %q", got, want)
	}
	if CompareSpecificity("a{x}", "a{x}") != 0 || CompareSpecificity("b{x}", "a{x}") <= 0 {
		t.Fatal("not a total order falling back on lexical order")
	}
}

// ResourceTemplates lists the templates matching a URI the most specific
// first, not in lexical order.
func TestResourceTemplatesMostSpecificFirst(t *testing.T) {
	b, err := NewBook(map[string]map[string]Rule{"s": {
		ResourceKey("x://a{+rest}"):     {Price: 2_000},
		ResourceKey("x://{a}/deep/{c}"): {Price: 4_000},
		ResourceKey("x://{+all}"):       {Price: 1_000},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := b.ResourceTemplates("s", "x://a/deep/z")
	if want := []string{"x://{a}/deep/{c}", "x://a{+rest}", "x://{+all}"}; !slices.Equal(got, want) {
		t.Fatalf("templates %q, want %q", got, want)
	}
}

func TestUnmatched(t *testing.T) {
	b, err := NewBook(map[string]map[string]Rule{"s": {
		"search":                             {Price: 1_000},
		"serch":                              {Price: 1_000},
		"echo":                               {}, // a free rule names an item too
		PromptKey("brief"):                   {Price: 1_000},
		PromptKey("breif"):                   {Price: 1_000},
		ResourceKey("docs://guide"):          {Price: 1_000}, // listed
		ResourceKey("docs://pages/intro"):    {Price: 1_000}, // matches a listed template
		ResourceKey("notes://{day}"):         {Price: 1_000}, // a template: prices what it matches
		ResourceKey("docs://pages/{id}"):     {Price: 1_000}, // listed template
		ResourceKey("docs://guid"):           {Price: 1_000},
		ResourceKey("other://pages/intro"):   {Price: 1_000},
		ResourceKey("docs://{unclosed"):      {Price: 1_000}, // no template: a URI nothing lists
		ResourceKey("docs://pages/a/b/../c"): {Price: 1_000},
	}})
	if err != nil {
		t.Fatal(err)
	}
	l := Listing{
		Tools: []string{"search", "echo"}, Prompts: []string{"brief"},
		Resources: []string{"docs://guide"}, Templates: []string{"docs://pages/{id}"},
		ToolsKnown: true, PromptsKnown: true, ResourcesKnown: true,
	}
	want := []string{PromptKey("breif"), ResourceKey("docs://guid"), ResourceKey("docs://pages/a/b/../c"),
		ResourceKey("docs://{unclosed"), ResourceKey("other://pages/intro"), "serch"}
	slices.Sort(want)
	if got := b.Unmatched("s", l); !slices.Equal(got, want) {
		t.Fatalf("unmatched %q, want %q", got, want)
	}
	// A list that has not arrived is not checked.
	if got := b.Unmatched("s", Listing{ToolsKnown: true, Tools: l.Tools}); !slices.Equal(got, []string{"serch"}) {
		t.Fatalf("with only the tools known: %q", got)
	}
	if got := b.Unmatched("other", l); len(got) != 0 {
		t.Fatalf("a server without rules: %q", got)
	}
}

func TestMayMatch(t *testing.T) {
	b, err := NewBook(map[string]map[string]Rule{"s": {
		ResourceKey("file:///docs/guide"):     {Price: 1_000},
		ResourceKey("file:///private/{name}"): {Price: 1_000},
		ResourceKey("weather://{city}"):       {},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for tpl, want := range map[string]bool{
		"file:///{+path}":      true,  // matches file:///docs/guide
		"file:///docs/{name}":  true,  // matches file:///docs/guide
		"file:///priv{+rest}":  true,  // may overlap file:///private/{name}
		"file:///public/{x}":   false, // matches no priced URI, overlaps no priced template
		"weather://{city}":     true,  // its own (free) rule
		"radar://{region}":     false,
		"file:///private/{id}": true,
	} {
		if got := b.MayMatch("s", tpl); got != want {
			t.Errorf("MayMatch(%q) = %v, want %v", tpl, got, want)
		}
	}
}
