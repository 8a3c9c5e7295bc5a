// Package docs holds the tests of capvend's documentation (README.md and
// docs/): its relative links lead somewhere, the README stays a front
// door (at most 300 lines), its package map names every package, and the
// docs files Go comments cite exist. The README test (internal/cli,
// TestREADME) runs the docs' commands.
package docs

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/capvend/capvend/internal/skip"
)

const (
	root   = "../.."
	module = "github.com/capvend/capvend"
)

// markdownFiles are README.md and docs/*.md, relative to the root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.ToSlash(filepath.Join("docs", filepath.Base(d))))
	}
	return files
}

// prose returns file's lines outside fenced code blocks, numbered from 1
// (lines inside blocks are empty), with inline code spans blanked.
func prose(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	code := regexp.MustCompile("`[^`]*`")
	var lines []string
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines = append(lines, "")
			continue
		}
		if fenced {
			lines = append(lines, "")
			continue
		}
		lines = append(lines, code.ReplaceAllStringFunc(line, func(s string) string {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				return s // a heading keeps its words for its anchor
			}
			return "``"
		}))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// slug is GitHub's anchor for a heading's text: lower case, letters,
// digits, '-' and '_' kept, spaces made '-', everything else dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// anchors are the anchors of file's headings (a repeated heading's get
// -1, -2, ... as on GitHub).
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(t, file) {
		h := strings.TrimLeft(line, "#")
		if h == line || !strings.HasPrefix(h, " ") {
			continue
		}
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinks: every relative link of README.md and docs/*.md names a file
// or folder that exists, and a heading of the Markdown file it names.
func TestLinks(t *testing.T) {
	checked := 0
	for _, file := range markdownFiles(t) {
		for i, line := range prose(t, file) {
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
					if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
						t.Errorf("%s:%d: link %s: %s does not exist", file, i+1, target, dest)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s:%d: link %s: an anchor in a file that is not Markdown", file, i+1, target)
					continue
				}
				if !anchors(t, dest)[anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading #%s", file, i+1, target, dest, anchor)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the parser is broken")
	}
}

// TestREADMEIsShort: the README is the front door (what capvend is, the
// two commands, a short configuration, the package map, links into
// docs/); the rest lives in docs/.
func TestREADMEIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 300 {
		t.Errorf("README.md has %d lines, more than 300: move the detail into docs/", n)
	}
}

var mapRowRE = regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")

// TestREADMEPackageMap: the README's package map names every package of
// the module (go list ./...), and every folder it names exists.
func TestREADMEPackageMap(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range mapRowRE.FindAllStringSubmatch(string(b), -1) {
		listed[m[1]] = true
		if st, err := os.Stat(filepath.Join(root, m[1])); err != nil || !st.IsDir() {
			t.Errorf("README.md's package map names %s, which is not a folder", m[1])
		}
	}
	cmd := exec.Command("go", "list", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		if _, lookErr := exec.LookPath("go"); lookErr != nil {
			skip.Missing(t, "the go command", "install Go")
		}
		t.Fatalf("go list: %v", err)
	}
	var missing []string
	for _, pkg := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		if rel != "" && !listed[rel] {
			missing = append(missing, rel)
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("README.md's package map lacks %s: add a row | `%s` | what it is for |", m, m)
	}
}

var docRefRE = regexp.MustCompile(`\bdocs/[A-Za-z0-9_-]+\.md\b`)

// TestGoCommentsCiteDocsThatExist: a docs file named in Go source (a
// comment, a help text, an error message) exists.
func TestGoCommentsCiteDocsThatExist(t *testing.T) {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, ref := range docRefRE.FindAllString(string(b), -1) {
			if _, err := os.Stat(filepath.Join(root, ref)); err != nil {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s cites %s, which does not exist", rel, ref)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
