package replica

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url, err string
	}{
		{"file:///var/backups/capvend", ""},
		{"s3://bucket/capvend", ""},
		{"s3://bucket/capvend?endpoint=http://127.0.0.1:9000&region=us-east-1&force-path-style=true", ""},
		{"file://host/var/backups", "file:///ABSOLUTE/PATH"},
		{"file:backups", "file:///ABSOLUTE/PATH"},
		{"s3:///capvend", "s3://BUCKET/PATH"},
		{"s3://key:secret@bucket/capvend", "credentials do not belong in the URL"},
		{"gs://bucket/capvend", "file:///PATH or s3://BUCKET/PATH"},
		{"/var/backups/capvend", "file:///PATH or s3://BUCKET/PATH"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := ParseURL(tc.url)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("ParseURL(%q) = %v, want %q", tc.url, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Fatalf("the error quotes the secret: %v", err)
			}
		})
	}
}

func TestReadCredentials(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
		err        string
	}{
		{"plain", "AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY=s3cr3t\n",
			[]string{"AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=s3cr3t"}, ""},
		{"comments, export, quotes", "# S3\n\nexport AWS_ACCESS_KEY_ID='AKID'\nAWS_SECRET_ACCESS_KEY=\"s3 cr3t\"\n",
			[]string{"AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=s3 cr3t"}, ""},
		{"another variable", "AWS_ACCESS_KEY_ID=AKID\nPATH=s3cr3t\n", nil, "line 2"},
		{"no equals", "s3cr3t\n", nil, "line 1"},
		{"empty", "# nothing\n", nil, "sets no variable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "replica.env")
			if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadCredentials(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Fatalf("the error quotes the secret: %v", err)
				}
				return
			}
			if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %q %v, want %q", got, err, tc.want)
			}
		})
	}
}

func TestRedactedDropsTheQuery(t *testing.T) {
	l := Litestream{URL: "s3://bucket/capvend?endpoint=http://127.0.0.1:9000"}
	if got := l.Redacted(); got != "s3://bucket/capvend" {
		t.Fatalf("Redacted() = %q", got)
	}
}
