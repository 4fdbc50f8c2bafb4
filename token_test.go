package sqllock

import (
	"testing"
)

func TestNewToken(t *testing.T) {
	a, err := newToken()
	if err != nil {
		t.Fatalf("newToken: got %v, want nil", err)
	}
	b, err := newToken()
	if err != nil {
		t.Fatalf("newToken: got %v, want nil", err)
	}
	for _, tok := range []string{a, b} {
		if !hexToken.MatchString(tok) {
			t.Errorf("newToken: got %q, want 32 lowercase hex digits", tok)
		}
	}
	if a == b {
		t.Errorf("two tokens: got %q twice, want two different", a)
	}
}
