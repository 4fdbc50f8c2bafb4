package sqllock

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// A round with a statement past the bounds every server takes runs two
// statements at once, else four.
func TestRoundParallel(t *testing.T) {
	small := renewStmt{size: smallLimits}
	large := renewStmt{size: renewLimits{smallLimits.rows + 1, smallLimits.bytes}}
	heavy := renewStmt{size: renewLimits{10, smallLimits.bytes + 1}}
	for _, c := range []struct {
		stmts []renewStmt
		want  int
	}{
		{[]renewStmt{small, small, small}, renewParallel},
		{[]renewStmt{small, large}, renewParallelLarge},
		{[]renewStmt{heavy}, renewParallelLarge},
		{nil, renewParallel},
	} {
		if got := roundParallel(c.stmts); got != c.want {
			t.Errorf("roundParallel(%v) = %d, want %d", c.stmts, got, c.want)
		}
	}
	if renewParallelLarge >= renewParallel {
		t.Errorf("large statements %d at once, small ones %d: want fewer large ones", renewParallelLarge, renewParallel)
	}
}

func TestRenewStatements(t *testing.T) {
	const owner = "tttttttttttttttttttttttttttttttt" // tokens are 32 bytes
	req := func(rows ...string) *renewReq {
		owners := slices.Repeat([]string{owner}, len(rows))
		return &renewReq{lits: renewLits(rows, owners), alone: make(chan error, 1)}
	}
	max := renewLimits{rows: 4096, bytes: 1 << 20}
	var due []*renewReq
	for i := range max.rows + 10 {
		due = append(due, req(fmt.Sprintf("n%05d", i)))
	}
	dup := req("n00001")
	due = append(due, dup, req("s1", "s2"))
	got := renewStatements(due, max)
	if len(got) != 2 || len(got[0].qs) != max.rows || len(got[1].qs) != 11 {
		t.Fatalf("got statements of %v leases, want %d and 11", lens(got), max.rows)
	}
	// Each statement's size is its rows' and their literals' bytes.
	for i, st := range got {
		want := renewLimits{}
		for _, q := range st.qs {
			for _, lit := range q.lits {
				n := strings.TrimPrefix(lit.Key, owner)
				want.rows++
				want.bytes += 4*len(n) + 74 // X'name', and X'owner name' of a 32-byte owner
			}
		}
		if st.size != want {
			t.Fatalf("statement %d: size %+v, want %+v", i, st.size, want)
		}
	}
	if got[1].size.rows != 12 {
		t.Fatalf("the last statement counts %d rows, want 12 (a set of two among them)", got[1].size.rows)
	}
	select {
	case err := <-dup.alone:
		if err != nil {
			t.Fatalf("a name twice: told %v, want nil: renew on its own", err)
		}
	default:
		t.Fatal("a renewal whose name another carries was not told to renew on its own")
	}
	// Long names: the bytes bound splits first.
	due = nil
	for i := range 2000 {
		due = append(due, req(fmt.Sprintf("%03d%s", i, strings.Repeat("x", 250))))
	}
	for _, s := range renewStatements(due, max) {
		if len(s.qs) > max.bytes/(4*253+74) || max.over(s.size) {
			t.Fatalf("a statement of %d names of 253 bytes (%+v), over %d bytes", len(s.qs), s.size, max.bytes)
		}
	}
}

func lens(ss []renewStmt) []int {
	var out []int
	for _, s := range ss {
		out = append(out, len(s.qs))
	}
	return out
}

func TestFitRows(t *testing.T) {
	const timeout = time.Second // a quarter: 250ms
	if got := fitRows(32768, 32768, 500*time.Millisecond, time.Minute, 4096, 34000); got != 16384 {
		t.Errorf("a long timeout: %d, want 16384 (a quarter of the guard's second, not of the timeout)", got)
	}
	for _, c := range []struct {
		cur, n int
		d      time.Duration
		want   int
	}{
		{0, 4096, 50 * time.Millisecond, 8192},        // quick: doubles from the small bound
		{8192, 8192, 100 * time.Millisecond, 16384},   // quick: doubles
		{32768, 32768, 100 * time.Millisecond, 34000}, // within the server's bound
		{16384, 16384, 500 * time.Millisecond, 8192},  // slow: what answers in a quarter
		{8192, 8192, 2 * time.Second, 4096},           // slower still: never below the small bound
		{16384, 8000, 10 * time.Millisecond, 16384},   // a small statement tells nothing
		{8192, 8192, 0, 16384},                        // an answer in no time
	} {
		if got := fitRows(c.cur, c.n, c.d, timeout, 4096, 34000); got != c.want {
			t.Errorf("fitRows(%d, %d, %v): %d, want %d", c.cur, c.n, c.d, got, c.want)
		}
	}
}
