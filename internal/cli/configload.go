package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// configPath picks the configuration file: the flag, else $CAPVEND_CONFIG,
// else ./capvend.yaml. explicit reports whether the user named one (then it
// must exist).
func configPath(flagValue string, getenv func(string) string) (path string, explicit bool) {
	if flagValue != "" {
		return flagValue, true
	}
	if v := getenv("CAPVEND_CONFIG"); v != "" {
		return v, true
	}
	return "capvend.yaml", false
}

// loadConfig reads and validates the configuration. A missing default file
// means the defaults; a missing file the user named is an error.
func loadConfig(flagValue string, getenv func(string) string) (*Config, error) {
	path, explicit := configPath(flagValue, getenv)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		c := defaultConfig()
		return &c, c.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parseConfig(path, data, getenv)
}

// parseConfig expands $VAR and ${VAR} (from getenv; "$$" is a literal
// "$"), decodes strictly (unknown fields are errors), applies defaults,
// resolves relative paths against the file's directory, and validates.
func parseConfig(path string, data []byte, getenv func(string) string) (*Config, error) {
	expanded, err := expandEnv(data, getenv)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c := defaultConfig()
	var doc yaml.Node
	if err := yaml.Unmarshal(expanded, &doc); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if errs := unknownFields(&doc, reflect.TypeOf(c), ""); len(errs) > 0 {
		return nil, fmt.Errorf("config %s: %w", path, errors.Join(errs...))
	}
	dec := yaml.NewDecoder(bytes.NewReader(expanded))
	dec.KnownFields(true) // unknownFields said it better; a backstop
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config %s: %s", path, strings.ReplaceAll(err.Error(), "yaml: unmarshal errors:\n  ", ""))
	}
	c.path = path
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c.resolvePaths(dir)
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &c, nil
}

var envRef = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expandEnv replaces $VAR and ${VAR}, line by line so an unset variable is
// reported with its line. Comments are expanded too but never fail: a
// commented-out line may name a variable that is not set.
func expandEnv(data []byte, getenv func(string) string) ([]byte, error) {
	lines := bytes.Split(data, []byte("\n"))
	for i, line := range lines {
		comment := bytes.HasPrefix(bytes.TrimSpace(line), []byte("#"))
		var missing string
		lines[i] = envRef.ReplaceAllFunc(line, func(m []byte) []byte {
			if string(m) == "$$" {
				return []byte("$")
			}
			name := strings.Trim(string(m), "${}")
			v := getenv(name)
			if v == "" && missing == "" && !comment {
				missing = name
			}
			return []byte(v)
		})
		if missing != "" {
			return nil, fmt.Errorf("line %d: environment variable $%s is not set (write $$ for a literal $)", i+1, missing)
		}
	}
	return bytes.Join(lines, []byte("\n")), nil
}

// UnmarshalYAML decodes the ledger section, taking a bare 0 for
// results_retention (keep forever) as 0s: YAML reads 0 as an integer,
// which is no duration.
func (c *LedgerConfig) UnmarshalYAML(n *yaml.Node) error {
	type plain LedgerConfig
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := n.Content[i], n.Content[i+1]; k.Value == "results_retention" && v.Tag == "!!int" && v.Value == "0" {
			v.Tag, v.Value = "!!str", "0s"
		}
	}
	return n.Decode((*plain)(c))
}

func (c *Config) resolvePaths(dir string) {
	abs := func(p *string) {
		if *p == "" || filepath.IsAbs(*p) {
			return
		}
		if strings.HasPrefix(*p, "~/") {
			if home, err := os.UserHomeDir(); err == nil {
				*p = filepath.Join(home, (*p)[2:])
				return
			}
		}
		*p = filepath.Join(dir, *p)
	}
	abs(&c.Ledger.Path)
	abs(&c.Ledger.DSNFile)
	abs(&c.Ledger.ReplicaCredentialsFile)
	if strings.ContainsRune(c.Ledger.LitestreamBin, filepath.Separator) {
		abs(&c.Ledger.LitestreamBin)
	}
	abs(&c.HTTP.AuthTokenFile)
	abs(&c.Admin.TokenFile)
	abs(&c.Nostr.NsecFile)
	abs(&c.LND.TLSCertFile)
	abs(&c.LND.MacaroonFile)
	abs(&c.Cashu.WalletDir)
	abs(&c.NWC.URIFile)
	for i := range c.NWC.Wallets {
		abs(&c.NWC.Wallets[i].URIFile)
	}
	for i := range c.Upstreams {
		abs(&c.Upstreams[i].Cwd)
	}
}
