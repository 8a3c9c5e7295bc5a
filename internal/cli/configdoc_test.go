package cli

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/capvend/capvend/internal/capvendtest"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/CONFIGURATION.md from the configuration types")

// TestConfigurationReferenceIsCurrent checks docs/CONFIGURATION.md against
// the configuration types: every key, its type, its default and its doc
// comment. A key added, renamed or documented anew without regenerating
// fails here; regenerate with
//
//	go test ./internal/cli -run TestConfigurationReferenceIsCurrent -update-docs
func TestConfigurationReferenceIsCurrent(t *testing.T) {
	got, err := configReference()
	if err != nil {
		t.Fatal(err)
	}
	const path = "../../docs/CONFIGURATION.md"
	if *updateDocs {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (generate it with -update-docs)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/CONFIGURATION.md is stale: the configuration types changed; regenerate it:\n\tgo test ./internal/cli -run TestConfigurationReferenceIsCurrent -update-docs\nlines only in the file (-) and only generated (+):\n%s",
			capvendtest.LineDiff(string(want), string(got)))
	}
}

// TestConfigurationReferenceCoversEveryKey checks the generator itself:
// every key the strict decoder accepts (each yaml-tagged field reachable
// from Config) has an entry with a description.
func TestConfigurationReferenceCoversEveryKey(t *testing.T) {
	docs, err := parseConfigDocs(".")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	seen := map[string]bool{}
	walkConfigKeys(reflect.TypeOf(Config{}), "", func(key string, owner reflect.Type, f reflect.StructField) {
		if et, _ := elemStruct(f.Type); et != nil && owner == reflect.TypeOf(Config{}) {
			if docs.types[et.Name()] == "" {
				missing = append(missing, fmt.Sprintf("%s (type %s)", key, et.Name()))
			}
			return // a section: its type's doc is its documentation
		}
		if seen[owner.Name()+"."+f.Name] {
			return // the same type under another key (tools, prompts, resources)
		}
		seen[owner.Name()+"."+f.Name] = true
		prefix := key[:strings.LastIndex(key, ".")+1]
		if docs.fieldDoc(owner, f, prefix) == "" {
			missing = append(missing, fmt.Sprintf("%s (%s.%s)", key, owner.Name(), f.Name))
		}
	})
	if len(missing) > 0 {
		t.Errorf("configuration keys without a doc comment (write one on the field; it is the key's documentation):\n\t%s", strings.Join(missing, "\n\t"))
	}
}

// configDocs holds the doc comments of the package's types and their
// fields, read from its source.
type configDocs struct {
	types  map[string]string
	fields map[string]map[string]string
}

func (d configDocs) field(typ, name string) string { return d.fields[typ][name] }

func parseConfigDocs(dir string) (configDocs, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return configDocs{}, err
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return configDocs{}, err
		}
		files = append(files, f)
	}
	d := configDocs{types: map[string]string{}, fields: map[string]map[string]string{}}
	for _, f := range files {
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				doc := ts.Doc.Text()
				if doc == "" {
					doc = g.Doc.Text()
				}
				d.types[ts.Name.Name] = doc
				fields := map[string]string{}
				for _, fl := range st.Fields.List {
					text := fl.Doc.Text()
					if c := fl.Comment.Text(); c != "" {
						text = strings.TrimSpace(text + " " + c)
					}
					for _, n := range fl.Names {
						fields[n.Name] = text
					}
				}
				d.fields[ts.Name.Name] = fields
			}
		}
	}
	return d, nil
}

var durationType = reflect.TypeOf(time.Duration(0))

// yamlKey is f's key, or "" when it has none.
func yamlKey(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	k, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if k == "-" {
		return ""
	}
	return k
}

// elemStruct is the struct type a key's value holds keys of (through
// pointers, slices and maps), or nil.
func elemStruct(t reflect.Type) (reflect.Type, string) {
	suffix := ""
	for {
		switch t.Kind() {
		case reflect.Pointer:
			t = t.Elem()
			continue
		case reflect.Slice:
			if t.Elem().Kind() == reflect.Struct || t.Elem().Kind() == reflect.Pointer {
				t, suffix = t.Elem(), suffix+"[]"
				continue
			}
		case reflect.Map:
			if t.Elem().Kind() == reflect.Struct || t.Elem().Kind() == reflect.Pointer {
				t, suffix = t.Elem(), suffix+".NAME"
				continue
			}
		}
		break
	}
	if t.Kind() == reflect.Struct && t != durationType {
		return t, suffix
	}
	return nil, ""
}

// walkConfigKeys calls fn for every key under t, depth first, in the
// types' field order.
func walkConfigKeys(t reflect.Type, prefix string, fn func(key string, owner reflect.Type, f reflect.StructField)) {
	for i := range t.NumField() {
		f := t.Field(i)
		k := yamlKey(f)
		if k == "" {
			continue
		}
		key := prefix + k
		fn(key, t, f)
		if et, suffix := elemStruct(f.Type); et != nil {
			walkConfigKeys(et, key+suffix+".", fn)
		}
	}
}

func configTypeName(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.Pointer:
		return configTypeName(t.Elem())
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() == reflect.Bool:
		return "bool"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "integer"
	case t.Kind() == reflect.Slice:
		if et, _ := elemStruct(t); et != nil {
			return "list of sections"
		}
		return "list of " + configTypeName(t.Elem()) + "s"
	case t.Kind() == reflect.Map:
		if et, _ := elemStruct(t); et != nil {
			return "map of name to section"
		}
		return "map of string to " + configTypeName(t.Elem())
	case t.Kind() == reflect.Struct:
		return "section"
	}
	return t.String()
}

// configDefault formats a default value, or "" for the zero value.
func configDefault(v reflect.Value) string {
	if !v.IsValid() || v.IsZero() {
		return ""
	}
	if v.Type() == durationType {
		return shortDuration(time.Duration(v.Int()))
	}
	switch v.Kind() {
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = fmt.Sprint(v.Index(i).Interface())
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return ""
	}
	return fmt.Sprint(v.Interface())
}

// shortDuration writes d as a user would: 30s, 10m, 720h, 1m30s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// fieldDoc is f's doc comment, or, for a field documented together with
// an earlier one (whose comment names it), a pointer to that one.
func (d configDocs) fieldDoc(t reflect.Type, f reflect.StructField, prefix string) string {
	if doc := d.field(t.Name(), f.Name); doc != "" {
		return userText(doc, t, "")
	}
	word := regexp.MustCompile(`\b` + f.Name + `\b`)
	for i := range t.NumField() {
		g := t.Field(i)
		if g.Name == f.Name {
			break
		}
		if k := yamlKey(g); k != "" && word.MatchString(d.field(t.Name(), g.Name)) {
			return "see `" + prefix + k + "`"
		}
	}
	return ""
}

// userText turns a doc comment on Go names into one on keys: the Go
// names of owner's fields become their keys (the leading one, the
// subject of the sentence, too), and lines are joined.
func userText(doc string, owner reflect.Type, self string) string {
	doc = strings.Join(strings.Fields(doc), " ")
	if owner == nil {
		return doc
	}
	names := map[string]string{}
	for i := range owner.NumField() {
		f := owner.Field(i)
		if k := yamlKey(f); k != "" {
			names[f.Name] = k
		}
	}
	if self != "" {
		names[owner.Name()] = self
	}
	return goNameRE.ReplaceAllStringFunc(doc, func(m string) string {
		i := strings.IndexFunc(m, unicode.IsUpper)
		if k, ok := names[m[i:]]; ok {
			return m[:i] + "`" + k + "`"
		}
		return m
	})
}

// goNameRE matches a capitalized word that is not a selector's name
// (mcpfront.Config.HTTP402 is left alone).
var goNameRE = regexp.MustCompile(`(^|[^.\w])[A-Z][A-Za-z0-9]*\b`)

// configReference renders docs/CONFIGURATION.md.
func configReference() ([]byte, error) {
	docs, err := parseConfigDocs(".")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(`# Configuration reference

<!-- Generated from the configuration types in internal/cli by
     go test ./internal/cli -run TestConfigurationReferenceIsCurrent -update-docs
     Do not edit by hand: edit the doc comments of the fields. -->

capvend reads one YAML file: ` + "`--config FILE`" + `, else ` + "`$CAPVEND_CONFIG`" + `,
else ` + "`./capvend.yaml`" + ` (a missing default file means every default below).
` + "`capvend init`" + ` writes a commented example. Unknown keys are errors. Values may
use ` + "`$VAR`" + ` and ` + "`${VAR}`" + ` from the environment (` + "`$$`" + ` is a literal ` + "`$`" + `). Relative
paths are resolved against the configuration file's directory. Secrets are
never written in the file: keys ending in ` + "`_file`" + ` name a file holding them.
Durations are Go durations: ` + "`30s`, `10m`, `720h`" + `. Prices are integer sats or
millisatoshis, never fractions.

`)
	def := reflect.ValueOf(defaultConfig())
	done := map[reflect.Type]string{}
	ct := reflect.TypeOf(Config{})
	// The table of contents: the top-level sections.
	var sections []string
	for i := range ct.NumField() {
		if k := yamlKey(ct.Field(i)); k != "" {
			sections = append(sections, k)
		}
	}
	b.WriteString("Sections: ")
	for i, s := range sections {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[`%s`](#%s)", s, s)
	}
	b.WriteString(".\n")
	for i := range ct.NumField() {
		f := ct.Field(i)
		k := yamlKey(f)
		if k == "" {
			continue
		}
		et, suffix := elemStruct(f.Type)
		fmt.Fprintf(&b, "\n## %s\n\n", k)
		if doc := docs.types[et.Name()]; doc != "" {
			b.WriteString(userText(doc, et, k) + "\n\n")
		}
		if suffix != "" {
			fmt.Fprintf(&b, "A %s: each entry has the keys below.\n\n", configTypeName(f.Type))
		}
		writeConfigKeys(&b, docs, et, k+suffix+".", def.Field(i), done)
	}
	return b.Bytes(), nil
}

func writeConfigKeys(b *bytes.Buffer, docs configDocs, t reflect.Type, prefix string, def reflect.Value, done map[reflect.Type]string) {
	type nested struct {
		key   string
		t     reflect.Type
		owner reflect.Type
		f     reflect.StructField
	}
	var later []nested
	for i := range t.NumField() {
		f := t.Field(i)
		k := yamlKey(f)
		if k == "" {
			continue
		}
		key := prefix + k
		fmt.Fprintf(b, "- **`%s`** (%s", key, configTypeName(f.Type))
		var dv reflect.Value
		if def.IsValid() && def.Kind() == reflect.Struct {
			dv = def.Field(i)
		}
		if d := configDefault(dv); d != "" {
			fmt.Fprintf(b, ", default `%s`", d)
		}
		b.WriteString(")")
		if doc := docs.fieldDoc(t, f, prefix); doc != "" {
			b.WriteString(": " + doc)
		}
		b.WriteString("\n")
		if et, suffix := elemStruct(f.Type); et != nil {
			later = append(later, nested{key: key + suffix, t: et, owner: t, f: f})
		}
	}
	for _, n := range later {
		fmt.Fprintf(b, "\n### %s\n\n", n.key)
		if first, ok := done[n.t]; ok {
			fmt.Fprintf(b, "The keys of `%s`.\n", first)
			continue
		}
		done[n.t] = n.key
		if doc := docs.types[n.t.Name()]; doc != "" {
			b.WriteString(userText(doc, n.t, n.key) + "\n\n")
		}
		writeConfigKeys(b, docs, n.t, n.key+".", reflect.Value{}, done)
	}
}
