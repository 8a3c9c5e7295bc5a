package vend_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/yosida95/uritemplate/v3"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// templateItems is an ItemSource of one upstream ("demo") that lists the
// resource templates templates and the resources uris, routing a read as
// upstream.Manager does: a listed URI to itself, else the first listed
// template it matches. It counts the reads it serves.
type templateItems struct {
	*fakeTools
	uris      []string
	templates []string
	reads     atomic.Int32
}

var _ vend.ItemSource = (*templateItems)(nil)

func (f *templateItems) PromptItem(string) (vend.Item, bool) { return vend.Item{}, false }

func (f *templateItems) ResourceItem(uri string) (vend.Item, bool) {
	match := func(tpl string) bool {
		ut, err := uritemplate.New(tpl)
		return err == nil && ut.Regexp().MatchString(uri)
	}
	t := vend.Item{Kind: vend.ItemResource, Name: uri, Server: "demo"}
	for _, u := range f.uris {
		if u == uri {
			t.UpstreamName = uri
		}
	}
	for _, tpl := range f.templates {
		switch {
		case tpl == uri:
			return vend.Item{Kind: vend.ItemResource, Name: uri, Server: "demo", UpstreamName: uri}, true
		case !match(tpl):
		case t.UpstreamName == "":
			t.UpstreamName = tpl
		default:
			t.Templates = append(t.Templates, tpl)
		}
	}
	return t, t.UpstreamName != ""
}

func (f *templateItems) GetPrompt(context.Context, string, map[string]string) (json.RawMessage, error) {
	return nil, errors.New("no prompts")
}

func (f *templateItems) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	f.reads.Add(1)
	b, _ := json.Marshal(uri)
	return json.RawMessage(`{"contents":[{"uri":` + string(b) + `,"text":"page"}]}`), nil
}

// The lists of a vend.Catalog: the URIs and templates.
func (f *templateItems) Prompts() []vend.Prompt { return nil }

func (f *templateItems) Resources() []vend.Resource {
	var out []vend.Resource
	for _, u := range f.uris {
		out = append(out, vend.Resource{URI: u})
	}
	return out
}

func (f *templateItems) ResourceTemplates() []vend.ResourceTemplate {
	var out []vend.ResourceTemplate
	for _, u := range f.templates {
		out = append(out, vend.ResourceTemplate{URITemplate: u})
	}
	return out
}

var _ vend.Catalog = (*templateItems)(nil)

// templateHarness is a Vendor selling items's resources at rules.
func templateHarness(t *testing.T, items *templateItems, rules map[string]pricing.Rule) *harness {
	items.fakeTools = &fakeTools{}
	return newHarness(t, false, func(c *vend.Config) {
		c.Tools = items
		c.Prices = newBook(t, rules)
	})
}

// Of several priced templates matching one URI, the most specific prices
// it (the most literal characters, then the fewest variables), whatever
// their order: which the upstream lists, which sorts first.
func TestMostSpecificResourceTemplateWins(t *testing.T) {
	for _, tc := range []struct {
		name      string
		listed    []string // the upstream's templates
		rules     map[string]pricing.Rule
		uri       string
		wantPrice vend.Msat
	}{
		{
			name:   "the upstream lists the general one",
			listed: []string{"docs://{+path}"},
			rules: map[string]pricing.Rule{
				pricing.ResourceKey("docs://{+path}"):        {Price: 1_000},
				pricing.ResourceKey("docs://{kind}/special"): {Price: 5_000},
			},
			uri: "docs://x/special", wantPrice: 5_000,
		},
		{
			name:   "the general one sorts first",
			listed: []string{"x://{+all}"},
			rules: map[string]pricing.Rule{
				pricing.ResourceKey("x://a{+rest}"):     {Price: 2_000},
				pricing.ResourceKey("x://{a}/deep/{c}"): {Price: 4_000},
			},
			uri: "x://a/deep/z", wantPrice: 4_000,
		},
		{
			name:   "same literal characters, fewer variables",
			listed: []string{"y://{+all}"},
			rules: map[string]pricing.Rule{
				pricing.ResourceKey("y://{a}{b}/p"): {Price: 2_000},
				pricing.ResourceKey("y://{ab}/p"):   {Price: 3_000},
			},
			uri: "y://q/p", wantPrice: 3_000,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := &templateItems{templates: tc.listed}
			h := templateHarness(t, items, tc.rules)
			if lo, hi := h.v.ItemPrice(vend.ItemResource, tc.uri); lo != tc.wantPrice || hi != tc.wantPrice {
				t.Errorf("%s listed at %d-%d msat, want %d (the most specific template's)", tc.uri, lo, hi, tc.wantPrice)
			}
			h.callAsync(readReq("r1", tc.uri, nil))
			if p := h.nextPayment(t); p.Amount != tc.wantPrice {
				t.Errorf("%s quoted %d msat, want %d", tc.uri, p.Amount, tc.wantPrice)
			}
		})
	}
}

// A priced resource never reads free, nor cheaper, under another spelling
// of its URI: one with dot segments (or percent-encoded unreserved
// characters) is refused, as it is not in its normal form; one with an
// empty segment or an encoded slash is priced at least as its plain
// spelling.
func TestResourceSpellingsNeverReadFree(t *testing.T) {
	rules := map[string]pricing.Rule{
		pricing.ResourceKey("file:///private/{name}"): {Price: 5_000},
		pricing.ResourceKey("file:///docs/guide"):     {Price: 3_000},
	}
	for _, tc := range []struct {
		uri       string
		wantPrice vend.Msat // 0: refused, never read
	}{
		{"file:///private/secret", 5_000},
		{"file:///docs/guide", 3_000},
		{"file:///private//secret", 5_000},
		{"file:////private/secret", 5_000},
		{"file:///private%2Fsecret", 5_000},
		{"file:///private%2fsecret", 0}, // lower-case hex: not normal
		{"file:///docs//guide", 3_000},
		{"file:///docs%2Fguide", 3_000},
		{"file:///private/./secret", 0},
		{"file:///public/../private/secret", 0},
		{"file:///private/%2E%2E/private/secret", 0},
		{"file:///%70rivate/secret", 0}, // an encoded unreserved character
		{"file:///docs/./guide", 0},
		{"file:///docs/x/../guide", 0},
	} {
		t.Run(tc.uri, func(t *testing.T) {
			items := &templateItems{templates: []string{"file:///{+path}"}, uris: []string{"file:///docs/guide"}}
			h := templateHarness(t, items, rules)
			lo, hi := h.v.ItemPrice(vend.ItemResource, tc.uri)
			if lo != tc.wantPrice || hi != tc.wantPrice {
				t.Fatalf("listed at %d-%d msat, want %d", lo, hi, tc.wantPrice)
			}
			ch := h.callAsync(readReq("r1", tc.uri, nil))
			if tc.wantPrice > 0 {
				if p := h.nextPayment(t); p.Amount != tc.wantPrice {
					t.Errorf("quoted %d msat, want %d", p.Amount, tc.wantPrice)
				}
				return
			}
			o := result(t, ch)
			var ip *vend.InvalidParamsError
			if !errors.As(o.err, &ip) || items.reads.Load() != 0 {
				t.Errorf("read %q: %s, %v (%d reads); want refused as invalid params, unread", tc.uri, o.res.Body, o.err, items.reads.Load())
			}
			// The fronts read a free resource from the Catalog: there too.
			body, err := h.v.Offered(items).ReadResource(context.Background(), tc.uri)
			if !errors.As(err, &ip) || !strings.Contains(ip.Reason, "normal form") || items.reads.Load() != 0 {
				t.Errorf("catalog read %q: %s, %v (%d reads); want refused as invalid params, unread", tc.uri, body, err, items.reads.Load())
			}
		})
	}
}
