package upstream

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// A stdio upstream gets PATH, HOME and what its configuration sets, and
// nothing else of capvend's environment (where secrets' paths and the
// operator's exports live).
func TestStdioUpstreamGetsOnlyItsConfiguredEnvironment(t *testing.T) {
	t.Setenv("CAPVEND_TEST_OPERATOR_SECRET", "do-not-leak")
	t.Setenv("HOME", t.TempDir())
	cfg := stdioConfig(t, "local", "l_")
	cfg.Env = append(cfg.Env, "WEATHER_KEY=configured", "HOME=/configured/home")
	e := newEvents()
	m, err := New(e.config(cfg))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitTools(t, m, e, "l_environ")
	body, err := m.CallTool(context.Background(), tool(t, m, "l_environ"), json.RawMessage(`{}`), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(body, &res); err != nil || len(res.Content) != 1 {
		t.Fatalf("result %s: %v", body, err)
	}
	var keys []string
	got := map[string]string{}
	for _, kv := range strings.Split(res.Content[0].Text, "\n") {
		k, v, _ := strings.Cut(kv, "=")
		keys = append(keys, k)
		got[k] = v
	}
	want := []string{envServe, "HOME", "PATH", "WEATHER_KEY"}
	slices.Sort(keys)
	if !slices.Equal(keys, want) {
		t.Fatalf("child environment has %v, want exactly %v", keys, want)
	}
	if got["PATH"] != os.Getenv("PATH") || got["HOME"] != "/configured/home" || got["WEATHER_KEY"] != "configured" {
		t.Fatalf("child environment %v", got)
	}
}

func TestChildEnv(t *testing.T) {
	getenv := func(k string) string {
		return map[string]string{"PATH": "/bin", "SECRET": "x"}[k]
	}
	got := childEnv(getenv, []string{"A=1"})
	if !slices.Equal(got, []string{"PATH=/bin", "A=1"}) {
		t.Fatalf("childEnv = %v", got)
	}
}
