package sqllock

import (
	"os"
	"strings"
	"testing"
)

// README's first example is examples/quickstart, which go vet and go test
// build: the copy in README.md must be the file, character for character.
func TestREADME_firstExampleIsQuickstart(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("examples/quickstart/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "```go\n")
	if !ok {
		t.Fatal("README.md has no go block")
	}
	first, _, ok := strings.Cut(after, "```\n")
	if !ok {
		t.Fatal("README.md's first go block does not end")
	}
	if first != string(program) {
		t.Errorf("README.md's first go block differs from examples/quickstart/main.go:\n%s", first)
	}
}

// maxREADMELines keeps README.md a front door: the detail lives under docs/.
const maxREADMELines = 150

func TestREADME_length(t *testing.T) {
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(text), "\n"); got > maxREADMELines {
		t.Errorf("README.md has %d lines, want at most %d: move the detail to a page under docs/", got, maxREADMELines)
	}
}
