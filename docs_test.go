package sqllock

import (
	"bytes"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// docFiles returns README.md and every page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no pages under docs/")
	}
	return append([]string{"README.md"}, pages...)
}

// A mdLine is a line of a Markdown file outside its fenced code blocks.
type mdLine struct {
	n    int // 1-based
	text string
}

// A codeBlock is a fenced code block of a Markdown file.
type codeBlock struct {
	line int    // of the opening fence, 1-based
	lang string // the info string's first word
	body string
}

// splitMarkdown separates a Markdown file's prose lines from its fenced
// code blocks (``` fences, as the project's pages use).
func splitMarkdown(text string) (prose []mdLine, blocks []codeBlock) {
	var cur *codeBlock
	var body []string
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == nil {
			if info, ok := strings.CutPrefix(trimmed, "```"); ok {
				lang, _, _ := strings.Cut(strings.TrimSpace(info), " ")
				cur, body = &codeBlock{line: i + 1, lang: lang}, nil
				continue
			}
			prose = append(prose, mdLine{i + 1, line})
			continue
		}
		if trimmed == "```" {
			cur.body = strings.Join(body, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		body = append(body, line)
	}
	if cur != nil {
		cur.body = strings.Join(body, "\n")
		blocks = append(blocks, *cur) // unterminated: TestDocs_goExamples says so
	}
	return prose, blocks
}

var (
	codeSpanRE   = regexp.MustCompile("`[^`]*`")
	mdLinkRE     = regexp.MustCompile(`\]\(([^)\s]*)(?:\s+"[^"]*")?\)`)
	mdRefDefRE   = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)`)
	headingRE    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	inlineLinkRE = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// headingSlugs returns the anchors GitHub gives the headings of a Markdown
// file: the text lowercased, punctuation other than - and _ dropped, each
// space turned into -, and -1, -2, ... added to repeats.
func headingSlugs(text string) map[string]bool {
	prose, _ := splitMarkdown(text)
	slugs := make(map[string]bool)
	seen := make(map[string]int)
	for _, l := range prose {
		m := headingRE.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		slug := githubSlug(m[1])
		if n := seen[slug]; n > 0 {
			seen[slug]++
			slug = fmt.Sprintf("%s-%d", slug, n)
		} else {
			seen[slug] = 1
		}
		slugs[slug] = true
	}
	return slugs
}

// githubSlug is the anchor of one heading's text, as GitHub renders it: the
// text a link shows stays, the link's target goes.
func githubSlug(heading string) string {
	heading = inlineLinkRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestDocs_githubSlug(t *testing.T) {
	for _, tt := range []struct{ heading, want string }{
		{"Running the tests", "running-the-tests"},
		{"Cron on several hosts: `sqllock run`", "cron-on-several-hosts-sqllock-run"},
		{"When to use GET_LOCK instead", "when-to-use-get_lock-instead"},
		{"sqllock's benchmarks", "sqllocks-benchmarks"},
		{"How it works, and what it gets right", "how-it-works-and-what-it-gets-right"},
		{"Fencing writes in the same database: Lock.Check", "fencing-writes-in-the-same-database-lockcheck"},
		{"See [the table](x.md#y)", "see-the-table"},
	} {
		if got := githubSlug(tt.heading); got != tt.want {
			t.Errorf("githubSlug(%q): got %q, want %q", tt.heading, got, tt.want)
		}
	}
	slugs := headingSlugs("# A\n## A\n```sh\n# A\n```\n### A\n")
	for _, want := range []string{"a", "a-1", "a-2"} {
		if !slugs[want] {
			t.Errorf("headingSlugs: no %q in %v", want, slugs)
		}
	}
	if slugs["a-3"] {
		t.Errorf("headingSlugs: a heading inside a code block counted: %v", slugs)
	}
}

// checkLinks reports each relative link of the Markdown file name whose
// file is missing, or whose #anchor names no heading of its target.
func checkLinks(name string) ([]string, error) {
	text, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var bad []string
	prose, _ := splitMarkdown(string(text))
	for _, l := range prose {
		line := codeSpanRE.ReplaceAllString(l.text, "")
		links := mdLinkRE.FindAllStringSubmatch(line, -1)
		if m := mdRefDefRE.FindStringSubmatch(l.text); m != nil {
			links = append(links, m)
		}
		for _, m := range links {
			target := m[1]
			if target == "" || strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			where := fmt.Sprintf("%s:%d: %s", name, l.n, target)
			path, anchor, _ := strings.Cut(target, "#")
			file := name
			if path != "" {
				if filepath.IsAbs(path) {
					bad = append(bad, where+": an absolute path")
					continue
				}
				file = filepath.Join(filepath.Dir(name), filepath.FromSlash(path))
				if rel, err := filepath.Rel(".", file); err != nil || strings.HasPrefix(rel, "..") {
					bad = append(bad, where+": outside the repository")
					continue
				}
				if _, err := os.Stat(file); err != nil {
					bad = append(bad, where+": no such file")
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				bad = append(bad, where+": an anchor into a file that is not Markdown")
				continue
			}
			target2, err := os.ReadFile(file)
			if err != nil {
				bad = append(bad, where+": "+err.Error())
				continue
			}
			if !headingSlugs(string(target2))[anchor] {
				bad = append(bad, fmt.Sprintf("%s: no heading of %s has the anchor #%s", where, file, anchor))
			}
		}
	}
	return bad, nil
}

// Every relative link of README.md and docs/*.md leads to a file that
// exists, and every #anchor to a heading of its page.
func TestDocs_links(t *testing.T) {
	for _, name := range docFiles(t) {
		bad, err := checkLinks(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Error(b)
		}
	}
}

// checkGoBlock checks one ```go block: a whole file (it starts with a
// comment or package) parses, is gofmt'd, and, if it is a command, is a
// file under examples/ (which go vet and go test build) or builds; a
// fragment parses, as statements in a function or as declarations, and is
// gofmt'd there.
func checkGoBlock(t *testing.T, body string, examples map[string]bool) error {
	t.Helper()
	first := strings.TrimSpace(body)
	if strings.HasPrefix(first, "//") || strings.HasPrefix(first, "/*") || strings.HasPrefix(first, "package ") {
		f, err := parser.ParseFile(token.NewFileSet(), "block", body, parser.ParseComments)
		if err != nil {
			return err
		}
		if err := checkFormatted(body); err != nil {
			return err
		}
		if f.Name.Name != "main" || examples[body] {
			return nil
		}
		return buildCommand(t, body)
	}
	// Statements, inside a function: indented as gofmt would indent them.
	var in strings.Builder
	in.WriteString("package p\n\nfunc _() {\n")
	for _, line := range strings.SplitAfter(body, "\n") {
		if strings.TrimSpace(line) != "" {
			in.WriteString("\t")
		}
		in.WriteString(line)
	}
	in.WriteString("}\n")
	stmtErr := checkFragment(in.String())
	if stmtErr == nil {
		return nil
	}
	// Declarations, at the top level.
	if err := checkFragment("package p\n\n" + body); err == nil {
		return nil
	}
	return stmtErr
}

// checkFragment parses src, a fragment wrapped in a file, and checks that
// gofmt leaves it as it is.
func checkFragment(src string) error {
	if _, err := parser.ParseFile(token.NewFileSet(), "block", src, parser.ParseComments); err != nil {
		return err
	}
	return checkFormatted(src)
}

// checkFormatted reports whether gofmt would change src.
func checkFormatted(src string) error {
	formatted, err := format.Source([]byte(src))
	if err != nil {
		return err
	}
	if !bytes.Equal(formatted, []byte(src)) {
		return fmt.Errorf("not gofmt'd; gofmt makes it:\n%s", formatted)
	}
	return nil
}

// buildCommand builds a package main given as one file, in a folder inside
// the module so that it imports sqllock and the module's driver.
func buildCommand(t *testing.T, src string) error {
	t.Helper()
	dir, err := os.MkdirTemp(".", "docs-example-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", os.DevNull, "./"+filepath.ToSlash(dir))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}

// Every ```go block of README.md and docs/*.md is Go that parses and is
// gofmt'd, and a whole command either is a file under examples/ or builds.
func TestDocs_goExamples(t *testing.T) {
	examples := make(map[string]bool)
	err := filepath.WalkDir("examples", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		src, err := os.ReadFile(path)
		examples[string(src)] = true
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, name := range docFiles(t) {
		text, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		_, blocks := splitMarkdown(string(text))
		for _, b := range blocks {
			if b.lang != "go" {
				continue
			}
			n++
			if err := checkGoBlock(t, b.body, examples); err != nil {
				t.Errorf("%s:%d: the go block: %v\n%s", name, b.line, err, b.body)
			}
		}
	}
	if n == 0 {
		t.Error("no go blocks found")
	}
}

// docs/testing-your-code.md shows examples/report's files as they are, so
// that the example users read is one `go test` runs.
func TestDocs_testingYourCode_showsExamplesReport(t *testing.T) {
	text, err := os.ReadFile("docs/testing-your-code.md")
	if err != nil {
		t.Fatal(err)
	}
	_, blocks := splitMarkdown(string(text))
	shown := map[string]bool{}
	for _, b := range blocks {
		shown[b.body] = true
	}
	for _, f := range []string{"examples/report/report.go", "examples/report/report_test.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !shown[string(src)] {
			t.Errorf("docs/testing-your-code.md does not show %s as it is: copy the file into its go block", f)
		}
	}
}

// docs/recipes.md shows the examples' code as it is: each of its go blocks
// stands, character for character, in a program under examples/ or
// gocron/examples/, which a test runs.
func TestDocs_recipesShowTheExamples(t *testing.T) {
	text, err := os.ReadFile("docs/recipes.md")
	if err != nil {
		t.Fatal(err)
	}
	var programs []string
	for _, pattern := range []string{"examples/*/main.go", "gocron/examples/*/main.go"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			programs = append(programs, string(src))
		}
	}
	_, blocks := splitMarkdown(string(text))
	n := 0
	for _, b := range blocks {
		if b.lang != "go" {
			continue
		}
		n++
		if !slices.ContainsFunc(programs, func(p string) bool { return strings.Contains(p, b.body) }) {
			t.Errorf("docs/recipes.md:%d: the go block is in no program under examples/: copy it from the program\n%s", b.line, b.body)
		}
	}
	if n == 0 {
		t.Error("docs/recipes.md: no go blocks found")
	}
}
