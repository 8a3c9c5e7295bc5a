// Package exampletools is the small MCP server shipped with capvend to sell
// in the demo and the tests: word_count (a free tool), sha256 (the priced
// one in the examples), slow_count (reports progress), always_fails (fails
// after payment, to show refunds) and confirm (asks the user to confirm,
// an elicitation), plus a prompt (summarize) and a resource
// (example://readme), which capvend passes through for free.
// cmd/example-tools serves it as a program; `capvend demo` runs it
// in-process.
//
// With Options.CallsLog it writes one JSON line (a Record) per tools/call,
// prompts/get and resources/read it executes, before it answers: the
// upstream's own account of what ran, which tests (redteam) hold against
// capvend's ledger.
package exampletools

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// readmeURI is example-tools' one resource; readme its text.
const (
	readmeURI = "example://readme"
	readme    = "example-tools: word_count, sha256, slow_count and always_fails; prompt summarize(text).\n"
)

// Methods of the Records a calls log holds.
const (
	MethodStart = "start" // the process started; Env is its environment
	MethodTool  = "tools/call"
	MethodGet   = "prompts/get"
	MethodRead  = "resources/read"
)

// Record is one line of a calls log: a request the server executed (the
// handler ran), or the start of the process.
type Record struct {
	Method string `json:"method"` // MethodTool, MethodGet, MethodRead, or MethodStart
	// Name is the tool's or prompt's name, or the resource's URI, as the
	// server received it.
	Name string `json:"name,omitempty"`
	// Arguments are the tool's arguments exactly as received (the raw
	// JSON object, duplicate keys and all), or a prompt's arguments.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// Time is when the server received the request (or started).
	Time time.Time `json:"time"`
	PID  int       `json:"pid,omitempty"` // MethodStart only
	Env  []string  `json:"env,omitempty"` // MethodStart only: the process's environment
}

// Options configure NewServerWith.
type Options struct {
	// CallsLog, if set, gets one JSON line (a Record) per execution,
	// written with a single Write before the handler runs, so that it is
	// there when the answer is. Write errors fail the request.
	CallsLog io.Writer
	// ByteCount adds the tool byte_count, which reads its arguments as
	// most Go (and .NET) servers do: into a struct, matching keys without
	// regard to case (the red team's case-variant test sells it).
	ByteCount bool
	// Bulk adds the tool bulk, which answers BulkText(kib): large answers,
	// to sell through relays that limit message sizes (CEP-22 oversized
	// transfer).
	Bulk bool
}

// MaxBulkKiB is the most bulk answers.
const MaxBulkKiB = 8192

// bulkBlock is bulk's text, repeated: 64 bytes of valid UTF-8 with what
// JSON escapes (quotes, backslashes, control characters, <, >, &, U+2028)
// and characters of 2, 3 and 4 bytes, so that a transport that cuts or
// re-escapes it wrongly changes the text.
const bulkBlock = "bulk \"q\" \\ <a&b>\t\n é€😀\u2028 0123456789abcdefghijklmnopqrstu\n"

// BulkText is the answer of bulk {"kib": kib}: kib KiB (kib*1024 bytes)
// of text.
func BulkText(kib int) string { return strings.Repeat(bulkBlock, kib*1024/len(bulkBlock)) }

// NewServer returns the example MCP server: tools word_count, sha256,
// slow_count, always_fails and confirm, prompt summarize and resource
// example://readme. Serve it with mcp-go (stdio or Streamable HTTP).
func NewServer() *server.MCPServer { return NewServerWith(Options{}) }

// callsLog writes Records, one line per Write (atomic for an O_APPEND
// file shared by several processes).
type callsLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *callsLog) record(r Record) error {
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(append(b, '\n'))
	return err
}

// WriteRecord writes r to w as one calls-log line (cmd/example-tools
// writes its MethodStart line with it).
func WriteRecord(w io.Writer, r Record) error { return (&callsLog{w: w}).record(r) }

// ReadCallsLog reads the Records of a calls log, in order.
func ReadCallsLog(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("calls log line %q: %w", sc.Text(), err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// logging returns the server options that write every execution to o.CallsLog.
func (o Options) logging() []server.ServerOption {
	if o.CallsLog == nil {
		return nil
	}
	l := &callsLog{w: o.CallsLog}
	return []server.ServerOption{
		server.WithToolHandlerMiddleware(func(next server.ToolHandlerFunc) server.ToolHandlerFunc {
			return func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				args := r.Params.RawArguments
				if len(args) == 0 && r.Params.Arguments != nil {
					args, _ = json.Marshal(r.Params.Arguments)
				}
				if err := l.record(Record{Method: MethodTool, Name: r.Params.Name, Arguments: args}); err != nil {
					return nil, fmt.Errorf("calls log: %w", err)
				}
				return next(ctx, r)
			}
		}),
		server.WithPromptHandlerMiddleware(func(next server.PromptHandlerFunc) server.PromptHandlerFunc {
			return func(ctx context.Context, r mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				var args json.RawMessage
				if r.Params.Arguments != nil {
					args, _ = json.Marshal(r.Params.Arguments)
				}
				if err := l.record(Record{Method: MethodGet, Name: r.Params.Name, Arguments: args}); err != nil {
					return nil, fmt.Errorf("calls log: %w", err)
				}
				return next(ctx, r)
			}
		}),
		server.WithResourceHandlerMiddleware(func(next server.ResourceHandlerFunc) server.ResourceHandlerFunc {
			return func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				if err := l.record(Record{Method: MethodRead, Name: r.Params.URI}); err != nil {
					return nil, fmt.Errorf("calls log: %w", err)
				}
				return next(ctx, r)
			}
		}),
	}
}

// NewServerWith is NewServer with options.
func NewServerWith(o Options) *server.MCPServer {
	opts := append([]server.ServerOption{server.WithToolCapabilities(true),
		server.WithPromptCapabilities(true), server.WithResourceCapabilities(false, true)}, o.logging()...)
	s := server.NewMCPServer("example-tools", "1.0.0", opts...)
	s.AddPrompt(mcp.NewPrompt("summarize",
		mcp.WithPromptDescription("Ask for a short summary of a text."),
		mcp.WithArgument("text", mcp.RequiredArgument(), mcp.ArgumentDescription("the text to summarize")),
	), func(ctx context.Context, r mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		text := r.Params.Arguments["text"]
		if text == "" {
			return nil, fmt.Errorf("argument text is required")
		}
		return mcp.NewGetPromptResult("Summarize a text", []mcp.PromptMessage{
			mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Summarize the following text in one sentence:\n\n"+text)),
		}), nil
	})
	s.AddResource(mcp.NewResource(readmeURI, "readme",
		mcp.WithResourceDescription("What example-tools offers."), mcp.WithMIMEType("text/plain"),
	), func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: readmeURI, MIMEType: "text/plain", Text: readme}}, nil
	})
	s.AddTool(mcp.NewTool("word_count",
		mcp.WithDescription("Count the words, lines and characters of a text."),
		mcp.WithString("text", mcp.Required(), mcp.MaxLength(1<<20), mcp.Description("the text")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text, err := r.RequireString("text")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		lines := strings.Count(text, "\n")
		if text != "" && !strings.HasSuffix(text, "\n") {
			lines++
		}
		return mcp.NewToolResultText(fmt.Sprintf("%d words, %d lines, %d characters",
			len(strings.Fields(text)), lines, len([]rune(text)))), nil
	})
	s.AddTool(mcp.NewTool("sha256",
		mcp.WithDescription("The SHA-256 digest of a text, in hex."),
		mcp.WithString("text", mcp.Required(), mcp.MaxLength(1<<20), mcp.Description("the text to hash")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text, err := r.RequireString("text")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		sum := sha256.Sum256([]byte(text))
		return mcp.NewToolResultText(hex.EncodeToString(sum[:])), nil
	})
	s.AddTool(mcp.NewTool("slow_count",
		mcp.WithDescription("Count to n, one step per 50 ms, reporting progress."),
		mcp.WithNumber("n", mcp.Required(), mcp.Min(1), mcp.Max(100), mcp.Description("how far to count")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		n, err := r.RequireInt("n")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		var token mcp.ProgressToken
		if r.Params.Meta != nil {
			token = r.Params.Meta.ProgressToken
		}
		srv := server.ServerFromContext(ctx)
		for i := 1; i <= n; i++ {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			if token != nil && srv != nil {
				srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
					"progressToken": token, "progress": i, "total": n,
				})
			}
		}
		return mcp.NewToolResultText(fmt.Sprintf("counted to %d", n)), nil
	})
	s.AddTool(mcp.NewTool("always_fails",
		mcp.WithDescription("Always fails: shows that a paid call whose tool fails is refunded."),
		mcp.WithString("text", mcp.Description("ignored")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultError("this tool always fails"), nil
	})
	s.AddTool(mcp.NewTool("confirm",
		mcp.WithDescription("Ask the user to confirm (an elicitation); returns confirmed or declined."),
		mcp.WithString("question", mcp.MaxLength(1000), mcp.Description("what to ask (default: Proceed?)")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		// The answer comes back on a retry of the call (protocol
		// 2026-07-28; mcp-go does the same for older clients with
		// elicitation/create).
		if ans := server.ElicitationResponse(r.Params.InputResponses, "confirm"); ans != nil {
			content, _ := ans.Content.(map[string]any)
			if ans.Action == mcp.ElicitationResponseActionAccept && content["confirm"] == true {
				return mcp.NewToolResultText("confirmed"), nil
			}
			return mcp.NewToolResultText("declined"), nil
		}
		return server.NewInputRequestBuilder("").Elicit("confirm", mcp.ElicitationParams{
			Message: r.GetString("question", "Proceed?"),
			RequestedSchema: map[string]any{"type": "object",
				"properties": map[string]any{"confirm": map[string]any{"type": "boolean"}},
				"required":   []string{"confirm"}},
		}).ToolResult(), nil
	})
	if o.Bulk {
		s.AddTool(mcp.NewTool("bulk",
			mcp.WithDescription("A text of kib KiB (escapes and multi-byte characters included)."),
			mcp.WithNumber("kib", mcp.Required(), mcp.Min(1), mcp.Max(MaxBulkKiB), mcp.Description("the size of the text in KiB")),
		), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			kib, err := r.RequireInt("kib")
			if err != nil || kib < 1 || kib > MaxBulkKiB {
				return mcp.NewToolResultError(fmt.Sprintf("kib must be an integer in 1..%d", MaxBulkKiB)), nil
			}
			return mcp.NewToolResultText(BulkText(kib)), nil
		})
	}
	if o.ByteCount {
		// byte_count reads its arguments as most Go (and .NET) servers do:
		// into a struct, whose keys encoding/json matches without regard to
		// case ("TEXT" and "Text" are text). Its schema allows other
		// properties, as a schema without additionalProperties does.
		s.AddTool(mcp.NewTool("byte_count",
			mcp.WithDescription("The length of a text in bytes (0 without one)."),
			mcp.WithString("text", mcp.Description("the text to measure")),
		), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var a struct {
				Text string `json:"text"`
			}
			raw := r.Params.RawArguments
			if len(raw) == 0 {
				raw, _ = json.Marshal(r.Params.Arguments)
			}
			if err := json.Unmarshal(raw, &a); err != nil {
				return mcp.NewToolResultError(err.Error()), nil
			}
			return mcp.NewToolResultText(fmt.Sprintf("%d bytes", len(a.Text))), nil
		})
	}
	return s
}
