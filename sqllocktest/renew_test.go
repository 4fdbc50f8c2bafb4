package sqllocktest_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/sqllocktest"
)

// renewEnv sends queries.sql's statements, as a Client sends them to
// MySQL or MariaDB, to the fake's default table, with tokens of the
// test's choosing: renew_many's pairs name them.
type renewEnv struct {
	t   *testing.T
	ctx context.Context
	db  *sql.DB
	q   sqltext.Statements
}

func newRenewEnv(t *testing.T, srv *sqllocktest.Server) *renewEnv {
	b, err := os.ReadFile("queries.sql")
	if err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	t.Cleanup(func() { db.Close() })
	return &renewEnv{t: t, ctx: ctxFor(t), db: db, q: sqltext.MustSplit(string(b))}
}

// text is statement name without TiDB's hint, with lits bound.
func (e *renewEnv) text(name string, lits ...string) string {
	return sqltext.Bind(strings.ReplaceAll(e.q[name], sqltext.TiDBHint, ""), lits...)
}

func (e *renewEnv) exec(q string, args ...any) {
	e.t.Helper()
	if _, err := e.db.ExecContext(e.ctx, q, args...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *renewEnv) acquire(name, token string, ttl time.Duration) {
	e.t.Helper()
	us := ttl.Microseconds()
	e.exec(e.q["acquire"], name, token, "h", us, name, token, "h", token, us)
}

// lists are renew_many's and renew_found's two lists: the names, and for
// each its owner in owners and the name, concatenated.
func lists(names, owners []string) (in, pairs string) {
	var ns, ps []string
	for i, n := range names {
		ns = append(ns, sqltext.Hex(n))
		ps = append(ps, sqltext.Hex(owners[i]+n))
	}
	return strings.Join(ns, ", "), strings.Join(ps, ", ")
}

// renew is renew_many's text for ttl, the names and, for each, its owner
// in owners.
func (e *renewEnv) renew(ttl time.Duration, names, owners []string) string {
	in, pairs := lists(names, owners)
	return e.text("renew_many", strconv.FormatInt(ttl.Microseconds(), 10), in, pairs)
}

// found runs renew_found on the names, each with its owner in owners, and
// returns the rows, each its owner and name concatenated.
func (e *renewEnv) found(on interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, names, owners []string) ([]string, error) {
	in, pairs := lists(names, owners)
	rows, err := on.QueryContext(e.ctx, e.text("renew_found", in, pairs))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v []byte
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, string(v))
	}
	return out, rows.Err()
}

// foundBy is renew_found on the names, each under token.
func (e *renewEnv) foundBy(token string, names ...string) []string {
	e.t.Helper()
	owners := make([]string, len(names))
	for i := range owners {
		owners[i] = token
	}
	got, err := e.found(e.db, names, owners)
	if err != nil {
		e.t.Fatalf("renew_found of %q: %v", names, err)
	}
	return got
}

// renewed runs the renewal of the names, each under token, and returns
// the affected rows.
func (e *renewEnv) renewed(on interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, ttl time.Duration, token string, names ...string) (int64, error) {
	owners := make([]string, len(names))
	for i := range owners {
		owners[i] = token
	}
	res, err := on.ExecContext(e.ctx, e.renew(ttl, names, owners))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// left returns how long name's lease has left, whether it is live, and
// whether it is what a release with a minimum hold left.
func (e *renewEnv) left(name string) (left time.Duration, live, released bool) {
	e.t.Helper()
	var us sql.NullInt64
	var l, rel sql.NullBool
	err := e.db.QueryRowContext(e.ctx, e.q["inspect"], name).Scan(new(sql.NullString), new(uint64), &l, &us, new(sql.NullInt64), &rel)
	if err != nil {
		e.t.Fatalf("inspect %s: %v", name, err)
	}
	return time.Duration(us.Int64) * time.Microsecond, l.Bool, rel.Bool
}

var (
	tokenA = strings.Repeat("0a", 16)
	tokenB = strings.Repeat("0b", 16)
)

// renewLeases returns a fake on a frozen clock with leases of ttl: ours,
// expired, released (its row deleted), held (released with a minimum hold
// of ttl: live, its owner A's released form) and long (10 ttl) under
// tokenA, other under tokenB.
func renewLeases(t *testing.T, ttl time.Duration) (*sqllocktest.Server, *renewEnv) {
	srv := sqllocktest.New(t, sqllocktest.WithFrozenClock(time.Time{}))
	e := newRenewEnv(t, srv)
	for _, n := range []string{"ours", "expired", "released", "held"} {
		e.acquire(n, tokenA, ttl)
	}
	e.acquire("other", tokenB, ttl)
	e.acquire("long", tokenA, 10*ttl)
	if err := srv.Expire("expired"); err != nil {
		t.Fatal(err)
	}
	e.exec(e.q["release"], "released", tokenA)
	e.exec(e.q["release_at_least"], ttl.Microseconds(), "held", tokenA)
	return srv, e
}

// renew_many extends each listed lease only while it is its owner's (the
// pair's token) and live: never another owner's, an expired one, a
// released one (its row deleted, or its owner the token's released form
// after a minimum hold), and never to an earlier expiry. The affected
// rows count the leases extended, a name listed twice at most once.
func TestServer_renewMany(t *testing.T) {
	const ttl = time.Minute
	srv, e := renewLeases(t, ttl)
	if err := srv.Advance(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name  string
		rows  int64
		left  time.Duration // after
		live  bool
		token string // the pair's; tokenA when empty
	}{
		{"ours", 1, ttl, true, ""},
		{"other", 0, 50 * time.Second, true, ""},
		{"other", 1, ttl, true, tokenB},
		{"expired", 0, -10 * time.Second, false, ""},
		{"released", 0, 0, false, ""},
		{"held", 0, 50 * time.Second, true, ""},
		{"long", 1, 10*ttl - 10*time.Second, true, ""}, // never earlier: acquired_at's flip alone
		{"missing", 0, 0, false, ""},
	} {
		token := c.token
		if token == "" {
			token = tokenA
		}
		n, err := e.renewed(e.db, ttl, token, c.name)
		if err != nil || n != c.rows {
			t.Errorf("renew_many of %s: got %d rows, %v, want %d", c.name, n, err, c.rows)
		}
		if c.name == "missing" {
			continue
		}
		if left, live, _ := e.left(c.name); left != c.left || live != c.live {
			t.Errorf("%s after renew_many: %v left, live %v, want %v, %v", c.name, left, live, c.left, c.live)
		}
	}
	if _, _, released := e.left("held"); !released {
		t.Error("held after renew_many: no longer the released form")
	}

	// Several at once: only the matched rows count.
	if err := srv.Advance(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	n, err := e.renewed(e.db, ttl, tokenA, "ours", "other", "expired", "released", "held", "long", "missing")
	if err != nil || n != 2 {
		t.Errorf("renew_many of every name under A: got %d rows, %v, want 2 (ours, long)", n, err)
	}
	if left, _, _ := e.left("ours"); left != ttl {
		t.Errorf("ours: %v left, want %v", left, ttl)
	}
	if left, _, _ := e.left("other"); left != ttl-10*time.Second {
		t.Errorf("other: %v left, want %v", left, ttl-10*time.Second)
	}
	// A name listed twice, with a pair of each token: its one row, once.
	res, err := e.db.ExecContext(e.ctx, e.renew(2*ttl, []string{"other", "other"}, []string{tokenA, tokenB}))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Errorf("renew_many of other twice: got %d rows, want 1", n)
	}
	if left, _, _ := e.left("other"); left != 2*ttl {
		t.Errorf("other: %v left, want %v", left, 2*ttl)
	}
}

// renew_many locks the listed lease rows: it waits for a Check's
// transaction that holds one. On MariaDB the session guard fails it
// inside a transaction for any lease row it finds, whoever holds it, but
// not for a name without one.
func TestServer_renewManyLocksAndGuard(t *testing.T) {
	srv := sqllocktest.New(t, sqllocktest.WithLockWaitTimeout(50*time.Millisecond))
	e := newRenewEnv(t, srv)
	e.acquire("ours", tokenA, time.Minute)
	tx, err := e.db.BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(e.ctx, e.q["check"], "ours", tokenA); err != nil {
		t.Fatal(err)
	}
	if _, err := e.renewed(e.db, time.Minute, tokenA, "missing", "ours"); !errors.Is(err, sqllocktest.LockWaitTimeout) {
		t.Errorf("renew_many behind a Check: got %v, want a lock wait timeout", err)
	}
	if n, err := e.renewed(tx, time.Minute, tokenA, "ours"); err != nil || n != 1 {
		t.Errorf("renew_many in the Check's transaction on MySQL: got %d rows, %v, want 1", n, err)
	}

	srv = sqllocktest.New(t, sqllocktest.WithMariaDB())
	e = newRenewEnv(t, srv)
	e.acquire("ours", tokenA, time.Minute)
	e.acquire("other", tokenB, time.Minute)
	for _, c := range []struct {
		names []string
		guard bool
	}{
		{[]string{"missing"}, false},
		{[]string{"other"}, true},
		{[]string{"missing", "ours"}, true},
	} {
		tx, err := e.db.BeginTx(e.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.renewed(tx, time.Minute, tokenA, c.names...)
		var se sqllocktest.ServerError
		if got := errors.As(err, &se) && se.Number == 1690; got != c.guard || !got && err != nil {
			t.Errorf("renew_many of %q in a transaction on MariaDB: got %v, want the guard's 1690: %v", c.names, err, c.guard)
		}
		tx.Rollback()
	}
}

// renew_found finds a pair only while its lease is that owner's and live:
// never another owner's, an expired one, a released one (its row deleted,
// or its owner the token's released form after a minimum hold). A name
// listed twice is found at most once; the rows come in name order. What a
// renew_many extended is what it finds.
func TestServer_renewFound(t *testing.T) {
	const ttl = time.Minute
	srv, e := renewLeases(t, ttl)

	all := []string{"ours", "other", "expired", "released", "held", "long", "missing"}
	for _, c := range []struct {
		names, owners []string
		want          []string
	}{
		{[]string{"ours"}, []string{tokenA}, []string{tokenA + "ours"}},
		{[]string{"other"}, []string{tokenA}, nil},
		{[]string{"other"}, []string{tokenB}, []string{tokenB + "other"}},
		{[]string{"expired"}, []string{tokenA}, nil},
		{[]string{"released"}, []string{tokenA}, nil},
		{[]string{"held"}, []string{tokenA}, nil},
		{[]string{"missing"}, []string{tokenA}, nil},
		{[]string{"ours"}, []string{strings.ToUpper(tokenA)}, nil}, // bytes, not letters
		{[]string{"ours", "other"}, []string{tokenB, tokenA}, nil}, // each the other's
		{[]string{"other", "other"}, []string{tokenA, tokenB}, []string{tokenB + "other"}},
		{[]string{"ours", "ours"}, []string{tokenA, tokenA}, []string{tokenA + "ours"}},
		{[]string{"ours", "long", "other"}, []string{tokenA, tokenA, tokenB}, []string{tokenA + "long", tokenB + "other", tokenA + "ours"}},
	} {
		got, err := e.found(e.db, c.names, c.owners)
		if err != nil || strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("renew_found of %q: got %q, %v, want %q", c.names, got, err, c.want)
		}
	}

	// After a renew_many of every name under A: it finds what that extended.
	if err := srv.Advance(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	n, err := e.renewed(e.db, ttl, tokenA, all...)
	if err != nil || n != 2 {
		t.Fatalf("renew_many of every name under A: got %d rows, %v, want 2", n, err)
	}
	if got := e.foundBy(tokenA, all...); strings.Join(got, " ") != tokenA+"long "+tokenA+"ours" {
		t.Errorf("renew_found after renew_many: got %q, want long and ours", got)
	}
	// other, not extended, lapses; ours lives on.
	if err := srv.Advance(40 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := e.foundBy(tokenB, "other"); len(got) != 0 {
		t.Errorf("renew_found of other, lapsed: got %q, want none", got)
	}
	if got := e.foundBy(tokenA, "ours"); len(got) != 1 {
		t.Errorf("renew_found of ours, extended: got %q, want it", got)
	}
}

// renew_found is a consistent read: it waits for no transaction, reads a
// row another transaction wrote as last committed and its own
// transaction's writes as written, and is no statement MariaDB's session
// guard fails inside a transaction.
func TestServer_renewFoundReadsCommitted(t *testing.T) {
	for _, opts := range [][]sqllocktest.Option{nil, {sqllocktest.WithMariaDB()}} {
		srv := sqllocktest.New(t, append(opts, sqllocktest.WithLockWaitTimeout(50*time.Millisecond))...)
		e := newRenewEnv(t, srv)
		e.acquire("ours", tokenA, time.Minute)
		tx, err := e.db.BeginTx(e.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{e.q["check"], e.q["release"]} {
			if _, err := tx.ExecContext(e.ctx, q, "ours", tokenA); err != nil {
				t.Fatal(err)
			}
		}
		if got := e.foundBy(tokenA, "ours"); len(got) != 1 {
			t.Errorf("renew_found beside a transaction that deleted the lease: got %q, want the committed row", got)
		}
		if got, err := e.found(tx, []string{"ours"}, []string{tokenA}); err != nil || len(got) != 0 {
			t.Errorf("renew_found in the transaction that deleted the lease: got %q, %v, want none", got, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := e.foundBy(tokenA, "ours"); len(got) != 0 {
			t.Errorf("renew_found after the delete committed: got %q, want none", got)
		}
	}
}
