package vend

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// schemaCache compiles each tool's input schema once (keyed by the
// schema's text, so a changed upstream schema is recompiled).
type schemaCache struct {
	mu       sync.RWMutex
	compiled map[string]*jsonschema.Schema // nil entry: the schema does not compile
}

// validate checks args against t's input schema. A tool without a schema,
// or with one that does not compile (the upstream's mistake), accepts any
// JSON object. inst, if not nil, is args as jsonschema.UnmarshalJSON
// reads them (parseArgsObject's value that encodeArgs wrote as args):
// then they are not read again.
func (c *schemaCache) validate(t *Item, args []byte, inst any) error {
	if len(bytes.TrimSpace(t.InputSchema)) == 0 {
		return nil
	}
	c.mu.RLock()
	s, ok := c.compiled[string(t.InputSchema)] // no copy of the key for a lookup
	c.mu.RUnlock()
	if !ok {
		s = compileSchema(t.InputSchema)
		c.mu.Lock()
		if c.compiled == nil {
			c.compiled = map[string]*jsonschema.Schema{}
		}
		c.compiled[string(t.InputSchema)] = s
		c.mu.Unlock()
	}
	if s == nil {
		return nil
	}
	if inst == nil {
		var err error
		if inst, err = jsonschema.UnmarshalJSON(bytes.NewReader(args)); err != nil {
			return fmt.Errorf("arguments are not valid JSON: %v", err)
		}
	}
	if err := s.Validate(inst); err != nil {
		return fmt.Errorf("%s", schemaMessage(err))
	}
	return nil
}

func compileSchema(schema []byte) *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("capvend:tool-input.json", doc); err != nil {
		return nil
	}
	s, err := c.Compile("capvend:tool-input.json")
	if err != nil {
		return nil
	}
	return s
}

// schemaMessage turns a validation error into one line naming where the
// arguments are wrong.
func schemaMessage(err error) string {
	if ve, ok := err.(*jsonschema.ValidationError); ok {
		var parts []string
		printer := message.NewPrinter(language.English)
		for _, leaf := range leaves(ve) {
			loc := "/" + strings.Join(leaf.InstanceLocation, "/")
			parts = append(parts, fmt.Sprintf("at %s: %s", loc, leaf.ErrorKind.LocalizedString(printer)))
		}
		if len(parts) > 0 {
			return strings.Join(parts, "; ")
		}
	}
	return err.Error()
}

func leaves(ve *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(ve.Causes) == 0 {
		return []*jsonschema.ValidationError{ve}
	}
	var out []*jsonschema.ValidationError
	for _, c := range ve.Causes {
		out = append(out, leaves(c)...)
	}
	return out
}
