package upstream

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/vend"
)

// whoisOf is what a whois item answers for the _meta of its request: the
// clientPubkey in it, or "none".
func whoisOf(m *mcp.Meta) string {
	if m == nil {
		return "none"
	}
	if pk, ok := m.AdditionalFields[metaClientPubkey].(string); ok {
		return pk
	}
	return "none"
}

// addWhois adds (newTestServer) the tool whois, the prompt whois and the resource
// name://whois, which answer what whoisOf reads in their request.
func addWhois(s *server.MCPServer, name string) {
	s.AddTool(mcp.NewTool("whois"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(whoisOf(r.Params.Meta)), nil
	})
	s.AddPrompt(mcp.NewPrompt("whois"), func(ctx context.Context, r mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return mcp.NewGetPromptResult("", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(whoisOf(r.Params.Meta)))}), nil
	})
	s.AddResource(mcp.NewResource(name+"://whois", "whois"), func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: r.Params.URI, Text: whoisOf(r.Params.Meta)}}, nil
	})
}

// TestClientPubkeyOnlyWhenOptedIn (CEP-16): an upstream configured with
// ClientPubkey gets the pubkey of ctx (vend.WithClientPubkey) as
// params._meta.clientPubkey on tools/call (through mcp-go's client and
// the raw forwarder), prompts/get and resources/read; an upstream
// without it, or a request without a pubkey, gets none. The progress
// token still goes with it, and the raw forwarder's cached _meta does
// not keep a pubkey for the next call.
func TestClientPubkeyOnlyWhenOptedIn(t *testing.T) {
	const pk = "7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e"
	in, out := newTestServer("in"), newTestServer("out")
	addRawTools(in)
	hin, hout := startHTTP(t, in), startHTTP(t, out)
	local := stdioConfig(t, "local", "l_")
	local.ClientPubkey = true
	e := newEvents()
	m, err := New(e.config(
		ServerConfig{Name: "in", Prefix: "i_", URL: hin.url(), ClientPubkey: true},
		ServerConfig{Name: "out", Prefix: "o_", URL: hout.url()},
		local,
	))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitTools(t, m, e, "i_whois", "o_whois", "l_whois", "i_progress")
	waitCatalog(t, m, e, "i_whois", "o_whois", "l_whois", "in://whois", "out://whois", "stdio-upstream://whois")

	signed := vend.WithClientPubkey(context.Background(), pk)
	anon := context.Background()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		prefix string
		uri    string
		raw    bool
		want   string
	}{
		{"opted in", signed, "i_", "in://whois", true, pk},
		{"opted in, stdio", signed, "l_", "stdio-upstream://whois", false, pk},
		{"not opted in", signed, "o_", "out://whois", true, "none"},
		{"no pubkey", anon, "i_", "in://whois", true, "none"},
		{"no pubkey, stdio", anon, "l_", "stdio-upstream://whois", false, "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := tool(t, m, tc.prefix+"whois")
			body, err := m.CallTool(tc.ctx, tl, nil, nil, nil)
			if err != nil || text(t, body) != tc.want {
				t.Errorf("tools/call: %s %v, want %s", body, err, tc.want)
			}
			if tc.raw {
				if !m.CanCallRaw(tl) {
					t.Fatal("not raw")
				}
				body, err := m.CallToolRaw(tc.ctx, tl, nil, nil, nil)
				if err != nil || text(t, body) != tc.want {
					t.Errorf("raw tools/call: %s %v, want %s", body, err, tc.want)
				}
			}
			body, err = m.GetPrompt(tc.ctx, tc.prefix+"whois", nil)
			if err != nil || promptText(t, body) != "user "+tc.want {
				t.Errorf("prompts/get: %s %v, want %s", body, err, tc.want)
			}
			body, err = m.ReadResource(tc.ctx, tc.uri)
			if err != nil || resourceText(t, body) != tc.want {
				t.Errorf("resources/read: %s %v, want %s", body, err, tc.want)
			}
		})
	}

	t.Run("with a progress token", func(t *testing.T) {
		for _, raw := range []bool{false, true} {
			tl := tool(t, m, "i_progress")
			call := m.CallTool
			if raw {
				call = m.CallToolRaw
			}
			var notes []string
			body, err := call(signed, tl, nil, json.RawMessage(`"t"`), func(p json.RawMessage) {
				notes = append(notes, string(p))
				progressSeen <- struct{}{}
			})
			if err != nil || text(t, body) != "done" || len(notes) != 2 || !strings.Contains(notes[0], `"progressToken":"t"`) {
				t.Errorf("raw %v: %s %v, notes %q", raw, body, err, notes)
			}
		}
	})
}

// withClientPubkey overwrites a clientPubkey already in the _meta it is
// given and keeps the rest: the value is the signer's, whatever else put
// one there.
func TestWithClientPubkeyOverwrites(t *testing.T) {
	const pk = "7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e"
	u := &upstream{cfg: ServerConfig{ClientPubkey: true}}
	meta := &mcp.Meta{ProgressToken: "t", AdditionalFields: map[string]any{metaClientPubkey: strings.Repeat("0", 64), "x": 1}}
	got := u.withClientPubkey(vend.WithClientPubkey(context.Background(), pk), meta)
	if got.AdditionalFields[metaClientPubkey] != pk || got.AdditionalFields["x"] != 1 || got.ProgressToken != "t" {
		t.Errorf("meta %+v", got)
	}
	off := &upstream{cfg: ServerConfig{}}
	if got := off.withClientPubkey(vend.WithClientPubkey(context.Background(), pk), nil); got != nil {
		t.Errorf("not opted in: meta %+v", got)
	}
	raw, err := rawMeta("2026-07-28", "", pk)
	if err != nil || !strings.Contains(string(raw), `"clientPubkey":"`+pk+`"`) {
		t.Errorf("raw meta %s %v", raw, err)
	}
	if raw, _ := rawMeta("2026-07-28", "", ""); strings.Contains(string(raw), "clientPubkey") {
		t.Errorf("raw meta without a pubkey %s", raw)
	}
}
