package engine

import (
	"database/sql/driver"
	"strings"
	"testing"
	"time"
)

// A set's statements are made of its literals: every name, sorted, as a
// hex literal, and the token's; a release with a minimum hold is its own
// statement.
func TestServer_setStatements(t *testing.T) {
	srv := newTestServer(t, nil, "sqllock")
	set := NewSet([]string{"a", "b"}, "t0")
	if set.In != "X'61', X'62'" || set.TokenLit != "X'7430'" {
		t.Errorf("literals: in %q token %q", set.In, set.TokenLit)
	}
	for _, q := range []string{srv.SetAcquire(set, time.Second), srv.SetRefresh(set, time.Second), srv.SetCheck(set)} {
		if !strings.Contains(q, "X'61'") || !strings.Contains(q, "X'62'") || !strings.Contains(q, "X'7430'") {
			t.Errorf("a statement without the set's literals:\n%s", q)
		}
	}
	if q, stmt := srv.SetRelease(set, 0); stmt != "all_release" || !strings.Contains(q, set.In) {
		t.Errorf("release: %s\n%s", stmt, q)
	}
	if q, stmt := srv.SetRelease(set, time.Second); stmt != "all_release_at_least" || !strings.Contains(q, "1000000") {
		t.Errorf("release with a minimum hold: %s\n%s", stmt, q)
	}
}

// The two-row set acquire's insert id is twice the set's fence plus one;
// an even one says the mark did not come through.
func TestServer_ReadFences_twoRow(t *testing.T) {
	srv := newTestServer(t, nil, "sqllock")
	set := NewSet([]string{"a", "b"}, "t0")
	if err := srv.ReadFences(testCtx(t), set, driver.RowsAffected(0)); err == nil {
		t.Error("an insert id of 0: got nil, want an error")
	}
	if err := srv.ReadFences(testCtx(t), set, result(2*41+1)); err != nil || set.Fences[0] != 41 || set.Fences[1] != 41 {
		t.Errorf("insert id 83: fences %v, %v; want 41 each", set.Fences, err)
	}
}

// result is a statement's reply with insert id id.
type result int64

func (r result) LastInsertId() (int64, error) { return int64(r), nil }
func (r result) RowsAffected() (int64, error) { return 1, nil }
