package cli

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// yamlSections names the config's types as the file's reader knows
// them, in errors about unknown fields; a struct type not listed is
// named by its key (the top-level sections: "lnd", "http", ...).
var yamlSections = map[reflect.Type]string{
	reflect.TypeFor[Config]():         "the top level",
	reflect.TypeFor[UpstreamConfig](): "an upstream",
	reflect.TypeFor[ToolConfig]():     "a tool, prompt or resource",
	reflect.TypeFor[PerConfig]():      "a per-argument price",
}

// unknownFields walks the parsed file beside the type it decodes into
// and returns one error per key that type has no field for, with its
// line and the keys that do exist there. (The decoder's own KnownFields
// error names Go types; this names the file's sections.)
func unknownFields(n *yaml.Node, t reflect.Type, key string) []error {
	for n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var errs []error
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := yamlFields(t)
		section := yamlSections[t]
		if section == "" {
			section = key
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" {
				errs = append(errs, unknownFields(v, t, key)...)
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				errs = append(errs, fmt.Errorf("line %d: unknown field %q in %s (known fields: %s)", k.Line, k.Value, section, strings.Join(slices.Sorted(maps.Keys(fields)), ", ")))
				continue
			}
			errs = append(errs, unknownFields(v, ft, k.Value)...)
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && n.Kind == yaml.SequenceNode:
		for _, e := range n.Content {
			errs = append(errs, unknownFields(e, t.Elem(), key)...)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			errs = append(errs, unknownFields(n.Content[i], t.Elem(), n.Content[i-1].Value)...)
		}
	}
	return errs
}

// yamlFields maps the YAML keys of struct type t to their field types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields
}
