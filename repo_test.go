package sqllock

import (
	"bytes"
	"fmt"
	goscanner "go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"
)

// trackedFiles returns the files git knows in the repository, all modules,
// as slash paths from its root, which is this package's directory. Outside a
// git checkout (a module downloaded from the proxy) the test skips.
func trackedFiles(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("git ls-files: %v: not a git checkout", err)
	}
	files := make(map[string]bool)
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files[f] = true
		}
	}
	return files
}

// goNameRE finds a run of path characters that ends in ".go"; goFileNames
// keeps the runs that name a file.
var goNameRE = regexp.MustCompile(`[A-Za-z0-9_./-]+\.go`)

// goFileNames returns the .go file names in text: runs of path characters
// ending in ".go" that a word character does not continue (go.mod and
// .golden are not names of .go files). A glob (proof*.go, {a,b}.go), a URL
// and an import-path-like name (a host, then a path) are not names of this
// repository's files and are left out.
func goFileNames(text string) []string {
	var names []string
	for _, m := range goNameRE.FindAllStringIndex(text, -1) {
		start, end := m[0], m[1]
		if end < len(text) && isWordByte(text[end]) {
			continue
		}
		if start > 0 && strings.IndexByte("*}:", text[start-1]) >= 0 {
			continue
		}
		name := text[start:end]
		if strings.Contains(name, "//") || strings.HasPrefix(name, "/") {
			continue
		}
		name = strings.TrimPrefix(name, "./")
		first, _, _ := strings.Cut(name, "/")
		if base := path.Base(name); base == ".go" || strings.HasPrefix(base, ".") {
			continue
		}
		if strings.Contains(name, "/") && strings.Contains(first, ".") && first != ".." {
			continue
		}
		names = append(names, name)
	}
	return names
}

func isWordByte(b byte) bool {
	return b == '_' || '0' <= b && b <= '9' || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z'
}

// staleGoName reports whether name, found in the repository file from, is
// the name of a .go file git does not know. The rule:
//
//   - A name with a directory (internal/wait/wait.go, ../lock.go) must be a
//     tracked file relative to from's directory or to the repository's
//     root. If its first directory is a directory of neither, it names
//     another project's file (consul's api/semaphore.go) and is not checked.
//   - A bare name (lock.go) must be a tracked file in from's directory, in
//     the repository's root (the package the docs and most comments speak
//     of), or in a directory that from's text names with it, as in
//     "internal/wait's channel.go": a name whose file moved to another
//     package fails until the comment says where.
//   - A string literal that is a bare name and nothing else
//     (filepath.Join(dir, "main.go")) names a file the code makes, and is
//     not checked.
//
// So a file deleted or renamed fails wherever a comment or string still
// names it, and a name never fails because it is in another directory that
// the comment also names.
func staleGoName(tracked, dirs map[string]bool, from, text, name string) bool {
	dir := path.Dir(from)
	if strings.Contains(name, "/") {
		for _, base := range []string{dir, "."} {
			if tracked[path.Join(base, name)] {
				return false
			}
		}
		first, _, _ := strings.Cut(name, "/")
		return first == ".." || dirs[path.Join(dir, first)] || dirs[first]
	}
	if tracked[path.Join(dir, name)] || tracked[name] {
		return false
	}
	for d := range dirs {
		if tracked[path.Join(d, name)] && strings.Contains(text, d) {
			return false
		}
	}
	return true
}

// bareGoLitRE matches a string literal that is a bare .go name and nothing
// else.
var bareGoLitRE = regexp.MustCompile("^[\"`][A-Za-z0-9_.-]+\\.go[\"`]$")

// textsOf returns the comments and string literals of a Go file, or a whole
// Markdown or SQL file, each with its line.
func textsOf(name string, src []byte) []struct {
	line int
	text string
} {
	type text = struct {
		line int
		text string
	}
	if !strings.HasSuffix(name, ".go") {
		var texts []text
		for i, l := range strings.Split(string(src), "\n") {
			texts = append(texts, text{i + 1, l})
		}
		return texts
	}
	var texts []text
	fset := token.NewFileSet()
	file := fset.AddFile(name, -1, len(src))
	var s goscanner.Scanner
	s.Init(file, src, func(token.Position, string) {}, goscanner.ScanComments)
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.STRING && bareGoLitRE.MatchString(lit) {
			continue // a file the code makes: filepath.Join(dir, "main.go")
		}
		if tok == token.COMMENT || tok == token.STRING {
			texts = append(texts, text{fset.Position(pos).Line, lit})
		}
	}
	return texts
}

// No comment or string literal of a .go file, in any module of the
// repository, and no line of README.md, docs/*.md or a .sql file, names a
// .go file that git does not know (the rule is staleGoName's). A comment
// that says "see slots.go" after slots.go was split sends a reader to
// nothing; an error that names it tells a user less.
func TestRepo_goFileNamesExist(t *testing.T) {
	tracked := trackedFiles(t)
	dirs := make(map[string]bool)
	for f := range tracked {
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	checked := 0
	for f := range tracked {
		isDoc := f == "README.md" || path.Dir(f) == "docs" && strings.HasSuffix(f, ".md")
		if !strings.HasSuffix(f, ".go") && !strings.HasSuffix(f, ".sql") && !isDoc {
			continue
		}
		if f == "repo_test.go" {
			continue // its cases name stale files on purpose
		}
		src, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree, not yet in git's index
			}
			t.Fatal(err)
		}
		if bytes.HasPrefix(src, []byte("version https://git-lfs")) {
			continue
		}
		checked++
		for _, tx := range textsOf(f, src) {
			for _, name := range goFileNames(tx.text) {
				if staleGoName(tracked, dirs, f, tx.text, name) {
					t.Errorf("%s:%d: names %s, which git does not know", f, tx.line, name)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no file checked")
	}
}

// The rule itself, on names that must pass and names that must fail.
func TestRepo_staleGoName(t *testing.T) {
	const goExt = ".go" // names that must not exist, kept out of the repository's own text
	tracked := map[string]bool{"lock.go": true, "internal/wait/channel.go": true, "gocron/locker.go": true}
	dirs := map[string]bool{"internal": true, "internal/wait": true, "gocron": true}
	for _, tc := range []struct {
		from, text string
		want       []string // the stale names
	}{
		{"acquire.go", "// see lock.go and slots.go", []string{"slots.go"}},
		{"acquire.go", "// internal/wait's (channel.go)", nil},
		{"acquire.go", "// channel.go", []string{"channel.go"}},
		{"internal/wait/wait.go", "// channel.go and ../../lock.go", nil},
		{"internal/wait/wait.go", "// ../../gone" + goExt, []string{"../../gone" + goExt}},
		{"gocron/locker.go", "// locker.go, lock.go, internal/wait/look.go", []string{"internal/wait/look.go"}},
		{"lock.go", "// consul's api/semaphore.go, https://x.org/a/b" + goExt + ", github.com/a/b/c" + goExt, nil},
		{"lock.go", "// proof*.go, wait/{a,b}.go, go.mod, x.golden, .go", nil},
		{"lock.go", `"sqllock: those names are the semaphores' (slots.go)"`, []string{"slots.go"}},
	} {
		var got []string
		for _, name := range goFileNames(tc.text) {
			if staleGoName(tracked, dirs, tc.from, tc.text, name) {
				got = append(got, name)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %q: got stale %q, want %q", tc.from, tc.text, got, tc.want)
		}
	}
}
