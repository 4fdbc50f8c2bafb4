package sqllock

import (
	"time"

	"github.com/sqllock/sqllock/internal/engine"
)

// How a round of the shared renewal (renewal.go) is cut into statements,
// how large they are, and how many run at once: a Client starts with
// statements of the bound every server takes and sizes later ones by how
// fast the server answered (fit), within the server's bound
// (engine.RenewLimits) and the session guard's second.

// How many statements of one round run at once: renewParallel, or
// renewParallelLarge when one is past the bounds every server takes. Large
// statements slow each other on the server, and each must be done within
// the session guard's second: on 2 cores, two at a time grew them to half
// as many statements a period as four (docs/performance.md).
const (
	renewParallel      = 4
	renewParallelLarge = 2
)

// roundParallel is how many of the statements stmts run at once.
func roundParallel(stmts []renewStmt) int {
	for _, st := range stmts {
		if smallLimits.over(st.size) {
			return renewParallelLarge
		}
	}
	return renewParallel
}

// A renewAnswer is how many lease rows a statement carried and how long
// its answer took; 0 when it failed.
type renewAnswer struct {
	rows int
	took time.Duration
}

// guardLate is how late in a statement the session guard refuses it
// (queries.sql: a row that the server reaches more than a second after the
// statement began fails it with 1690): a statement of many leases must be
// done within it, whatever its timeout.
const guardLate = time.Second

// renewTimeout is how long a shared renewal of leases of ttl may take, as
// a Lock's own renewal (keepalive.go).
func renewTimeout(ttl time.Duration) time.Duration { return ttl / 4 }

// limits returns the bounds of a statement now: r.most leases, within
// the server's bounds (engine.RenewLimits), and their share of its bytes.
func (r *renewals) limits(c *Client) renewLimits {
	rows, bytes := c.eng.RenewLimits()
	r.mu.Lock()
	most := max(r.most, engine.SmallRenewRows)
	r.mu.Unlock()
	if most < rows {
		bytes = max(engine.SmallRenewBytes, int(int64(bytes)*int64(most)/int64(rows)))
		rows = most
	}
	return renewLimits{rows, bytes}
}

// renewLimits bound one statement: its lease rows, and their literals'
// bytes.
type renewLimits struct{ rows, bytes int }

// smallLimits are the bounds of a statement every server takes.
var smallLimits = renewLimits{engine.SmallRenewRows, engine.SmallRenewBytes}

// over reports whether a statement of size is past the bounds l.
func (l renewLimits) over(size renewLimits) bool {
	return size.rows > l.rows || size.bytes > l.bytes
}

// A renewStmt is the keep-alives one statement carries, and its size.
type renewStmt struct {
	qs   []*renewReq
	size renewLimits
}

// renewStatements splits the renewals due into statements within max,
// each name once in a statement. A
// renewal that shares a name with one before it (a Lock that lost the
// name, not yet told, and another that took it) is told at once to renew
// on its own.
func renewStatements(due []*renewReq, max renewLimits) []renewStmt {
	var (
		out  []renewStmt
		cur  renewStmt
		seen = map[string]bool{}
	)
	for _, q := range due {
		bytes := 0
		dup := false
		for _, lit := range q.lits {
			bytes += lit.Bytes()
			dup = dup || seen[lit.Name] // a name's literal names it alone
		}
		if dup {
			tell(q.alone, nil)
			continue
		}
		next := renewLimits{cur.size.rows + len(q.lits), cur.size.bytes + bytes}
		if len(cur.qs) > 0 && max.over(next) {
			out = append(out, cur)
			cur, next = renewStmt{}, renewLimits{len(q.lits), bytes}
		}
		cur.qs = append(cur.qs, q)
		cur.size = next
		for _, lit := range q.lits {
			seen[lit.Name] = true
		}
	}
	if len(cur.qs) > 0 {
		out = append(out, cur)
	}
	return out
}

// shrink halves the leases a statement carries, after a statement of n
// leases past the small bounds failed with err. Said once, in the log.
func (r *renewals) shrink(c *Client, n int, err error) {
	r.mu.Lock()
	r.most = n / 2
	was := r.shrunk
	r.shrunk = true
	r.mu.Unlock()
	if !was {
		c.log.Warn("sqllock: a shared renewal of many leases failed; they went again in smaller statements, and later ones carry half as many", "leases", n, "err", err)
	}
}

// fit sizes later statements after a round whose statements answered
// answers (fitRows), from the slowest of those that carried more than half
// as many leases as a statement may now; nothing changes when one failed.
func (r *renewals) fit(c *Client, ttl time.Duration, answers []renewAnswer) {
	maxRows, _ := c.eng.RenewLimits()
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := max(r.most, engine.SmallRenewRows)
	var slowest renewAnswer
	for _, a := range answers {
		if a.rows == 0 {
			return
		}
		if 2*a.rows > cur && a.took > slowest.took {
			slowest = a
		}
	}
	if slowest.rows > 0 {
		r.most = fitRows(r.most, slowest.rows, slowest.took, renewTimeout(ttl), engine.SmallRenewRows, maxRows)
	}
}

// fitRows returns how many leases later statements carry, cur now (0: as
// few as small), after a statement of n answered in d of its timeout: as
// many as would answer in a quarter of it, or of guardLate if that is
// shorter, at most twice cur, within small and most. A statement of less than half cur tells nothing (the fixed
// cost of a statement weighs more in a small one). So a Client starts
// with statements of the bound every server takes, and doubles them each
// round while the server answers quickly, up to the server's bound; on a
// server made slow (by many acquires, say) they shrink before one runs out
// of time, with room for the server's answers to vary fourfold.
func fitRows(cur, n int, d, timeout time.Duration, small, most int) int {
	cur = max(cur, small)
	if 2*n <= cur {
		return cur
	}
	fits := int(int64(n) * int64(min(timeout, guardLate)/4) / int64(max(d, time.Millisecond)))
	return max(small, min(fits, 2*cur, most))
}
