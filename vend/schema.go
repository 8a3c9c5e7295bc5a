package vend

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// schemaCache compiles each tool's input schema once (keyed by the schema's
// digest, so a changed upstream schema is recompiled).
type schemaCache struct {
	mu       sync.Mutex
	compiled map[[32]byte]*jsonschema.Schema // nil entry: the schema does not compile
}

// validate checks args against t's input schema. A tool without a schema,
// or with one that does not compile (the upstream's mistake), accepts any
// JSON object.
func (c *schemaCache) validate(t *Tool, args []byte) error {
	if len(bytes.TrimSpace(t.InputSchema)) == 0 {
		return nil
	}
	key := sha256.Sum256(t.InputSchema)
	c.mu.Lock()
	if c.compiled == nil {
		c.compiled = map[[32]byte]*jsonschema.Schema{}
	}
	s, ok := c.compiled[key]
	if !ok {
		s = compileSchema(t.InputSchema)
		c.compiled[key] = s
	}
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return fmt.Errorf("arguments are not valid JSON: %v", err)
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
