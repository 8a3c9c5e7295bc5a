package pricing

import (
	"slices"
	"strings"

	"github.com/yosida95/uritemplate/v3"
)

// CompareSpecificity orders resource price keys (URIs and URI templates,
// without the ResourceKey prefix) from the most specific: the one with
// more literal characters (those outside {expressions}) first; at equal
// count the one with fewer expressions; then in lexical order, so the
// order is total. A URI (no expression) is thus more specific than any
// template it matches. It returns a negative number when a is more
// specific than b, 0 when a == b, else a positive number.
func CompareSpecificity(a, b string) int {
	la, va := specificity(a)
	lb, vb := specificity(b)
	switch {
	case la != lb:
		return lb - la
	case va != vb:
		return va - vb
	}
	return strings.Compare(a, b)
}

// specificity counts the literal bytes of a URI template and its
// expressions; an unclosed '{' and what follows count as literal.
func specificity(tpl string) (literal, exprs int) {
	for {
		i := strings.IndexByte(tpl, '{')
		if i < 0 {
			return literal + len(tpl), exprs
		}
		j := strings.IndexByte(tpl[i:], '}')
		if j < 0 {
			return literal + len(tpl), exprs
		}
		literal += i
		exprs++
		tpl = tpl[i+j+1:]
	}
}

// isTemplate reports whether a resource key is a URI template (it has an
// expression the uritemplate package parses).
func isTemplate(key string) bool {
	if !strings.Contains(key, "{") {
		return false
	}
	_, err := uritemplate.New(key)
	return err == nil
}

// Listing is what one upstream lists, by the names its prices are keyed
// under: its tools' and prompts' names on the upstream (without a
// prefix), its resources' URIs and its resource templates. The lists of
// a kind whose Known flag is false have not arrived (the upstream was
// not reached, or listing them failed): they are not checked.
type Listing struct {
	Tools, Prompts, Resources, Templates     []string
	ToolsKnown, PromptsKnown, ResourcesKnown bool
}

// Unmatched returns the keys of server's rules (tool names, PromptKey,
// ResourceKey) that name nothing l lists, sorted: a tool or prompt it
// does not list; a resource URI it neither lists nor matches with a
// listed template. A resource key that is a URI template always names
// something, whether or not the upstream lists it: it prices the URIs it
// matches. Free rules are checked too: they name what they make free.
func (b *Book) Unmatched(server string, l Listing) []string {
	var templates []*uritemplate.Template
	if l.ResourcesKnown {
		for _, t := range l.Templates {
			if ut, err := uritemplate.New(t); err == nil {
				templates = append(templates, ut)
			}
		}
	}
	var out []string
	for key := range b.rules[server] {
		switch {
		case strings.HasPrefix(key, promptPrefix):
			if l.PromptsKnown && !slices.Contains(l.Prompts, key[len(promptPrefix):]) {
				out = append(out, key)
			}
		case strings.HasPrefix(key, resourcePrefix):
			uri := key[len(resourcePrefix):]
			if !l.ResourcesKnown || slices.Contains(l.Resources, uri) || slices.Contains(l.Templates, uri) || isTemplate(uri) {
				continue
			}
			if !slices.ContainsFunc(templates, func(t *uritemplate.Template) bool { return t.Regexp().MatchString(uri) }) {
				out = append(out, key)
			}
		default:
			if l.ToolsKnown && !slices.Contains(l.Tools, key) {
				out = append(out, key)
			}
		}
	}
	slices.Sort(out)
	return out
}

// MayMatch reports whether a rule of server's resources may apply to a
// URI that template (a URI template its upstream lists) matches: the
// template's own rule, a rule of a URI it matches, or of a URI template
// whose literal beginning agrees with its own (neither's text before its
// first expression extends beyond where the other's differs). It may say
// true of a template no rule applies to; never false of one a rule does.
func (b *Book) MayMatch(server, template string) bool {
	ut, err := uritemplate.New(template)
	if err != nil {
		return b.Has(server, ResourceKey(template))
	}
	re := ut.Regexp()
	head, _, _ := strings.Cut(template, "{")
	for key := range b.rules[server] {
		uri, ok := strings.CutPrefix(key, resourcePrefix)
		if !ok {
			continue
		}
		if !isTemplate(uri) {
			if re.MatchString(uri) {
				return true
			}
			continue
		}
		other, _, _ := strings.Cut(uri, "{")
		if strings.HasPrefix(head, other) || strings.HasPrefix(other, head) {
			return true
		}
	}
	return false
}
