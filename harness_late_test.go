package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// A lateAction is what a lateConnector does with one execution.
type lateAction int

const (
	pass     lateAction = iota // run it and hand back its reply
	lose                       // run it, then lose the reply (invalid connection)
	hold                       // run nothing now, lose the reply, run it when told (late)
	loseSlow                   // run it, then lose the reply after a pause (a slow network)
	refuse                     // run nothing, and answer as a deadlock would (1213)
)

// slowPause is how long loseSlow waits before it loses the reply.
const slowPause = 300 * time.Millisecond

// lateConnector connects to a real server and lets a test decide, for each
// execution of a prepared statement, whether it runs, runs with its reply
// lost, or is held back and run later: a statement that failed on the client
// but runs on the server afterwards (a thread pool's or a proxy's queue, CPU
// starvation, TCP delivering after the socket closed).
type lateConnector struct {
	driver.Connector
	mu     sync.Mutex
	decide func(query string, args []driver.NamedValue) lateAction
	held   []heldStmt
	// watch picks the executions counted in running, and the most of them
	// under way at once in peak.
	watch         func(query string) bool
	running, peak int
}

type heldStmt struct {
	query string
	args  []any
}

// lateDB opens the environment's server through a lateConnector, which
// passes everything until decide is set.
func (e *testEnv) lateDB(t *testing.T) (*sql.DB, *lateConnector) {
	t.Helper()
	lc := &lateConnector{Connector: e.quietConnector(t, func(*mysql.Config) {})}
	db := sql.OpenDB(lc)
	t.Cleanup(func() { db.Close() })
	return db, lc
}

// setDecide sets what the connector does with each execution from now on.
func (lc *lateConnector) setDecide(f func(query string, args []driver.NamedValue) lateAction) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.decide = f
}

// setWatch counts, from now on, the executions of the queries watch picks
// that are under way at once (mostAtOnce).
func (lc *lateConnector) setWatch(watch func(query string) bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.watch, lc.peak = watch, 0
}

// mostAtOnce returns the most executions setWatch's queries had under way
// at once.
func (lc *lateConnector) mostAtOnce() int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.peak
}

// runHeld runs the statements held back so far, in order, on db (the server
// straight), and forgets them; it returns how many it ran.
func (lc *lateConnector) runHeld(t *testing.T, db *sql.DB) int {
	t.Helper()
	lc.mu.Lock()
	held := lc.held
	lc.held = nil
	lc.mu.Unlock()
	for _, h := range held {
		if _, err := db.Exec(h.query, h.args...); err != nil {
			t.Fatalf("late %q: %v", h.query, err)
		}
	}
	return len(held)
}

func (lc *lateConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := lc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &lateConn{passConn: passConn{c}, lc: lc}, nil
}

type lateConn struct {
	passConn
	lc *lateConnector
}

func (c *lateConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &lateStmt{passStmt: passStmt{st}, lc: c.lc, query: query}, nil
}

// A passConn passes to the driver's connection what a test's wrapper of it
// does not change: transactions, session resets, validity and argument
// checks. The wrappers embed it and prepare statements of their own.
type passConn struct{ driver.Conn }

func (c passConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c passConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c passConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

func (c passConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

// A passStmt passes queries to the driver's statement; the wrappers embed
// it and execute statements their own way.
type passStmt struct{ driver.Stmt }

func (s passStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

type lateStmt struct {
	passStmt
	lc    *lateConnector
	query string
}

func (s *lateStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.lc.mu.Lock()
	act := pass
	if s.lc.decide != nil {
		act = s.lc.decide(s.query, args)
	}
	if s.lc.watch != nil && s.lc.watch(s.query) {
		s.lc.running++
		s.lc.peak = max(s.lc.peak, s.lc.running)
		defer func() {
			s.lc.mu.Lock()
			s.lc.running--
			s.lc.mu.Unlock()
		}()
	}
	if act == hold {
		h := heldStmt{query: s.query}
		for _, a := range args {
			h.args = append(h.args, a.Value)
		}
		s.lc.held = append(s.lc.held, h)
	}
	s.lc.mu.Unlock()
	switch act {
	case hold:
		return nil, mysql.ErrInvalidConn
	case refuse:
		return nil, &mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'},
			Message: "Deadlock found when trying to get lock; try restarting transaction"}
	case lose, loseSlow:
		if _, err := s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args); err != nil {
			return nil, err
		}
		if act == loseSlow {
			time.Sleep(slowPause)
		}
		return nil, mysql.ErrInvalidConn
	}
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

// is reports whether query is the Client's statement i, as it prepares it
// (TiDB's forms on TiDB).
func (le *lateEnv) is(query string, i int) bool {
	le.c.mu.Lock()
	defer le.c.mu.Unlock()
	return query == le.c.eng.Forms().SQL[i]
}

// arg returns execution argument i as a string.
func arg(args []driver.NamedValue, i int) string {
	switch v := args[i].Value.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// lateEnv is a Client whose statements go through a lateConnector, and a
// witness Client (another process) on the same table, straight.
type lateEnv struct {
	c, witness *Client
	lc         *lateConnector
	straight   *sql.DB
	table      string
}

func newLateEnv(t *testing.T, e *testEnv, opts ...Option) *lateEnv {
	t.Helper()
	table := e.newTable(t)
	db, lc := e.lateDB(t)
	straight := e.openDB(t)
	c := e.client(t, db, table, append([]Option{WithHolder("late")}, opts...)...)
	// The first use (the check and the proof) before any statement is held.
	mustAcquire(t, c, "warm", time.Second).Release(testCtx(t))
	return &lateEnv{c: c, witness: e.client(t, straight, table, WithHolder("witness")), lc: lc, straight: straight, table: table}
}

// owner reads the owner token and expiry of name's lease, straight.
func (le *lateEnv) owner(t *testing.T, name string) (owner string, expires string) {
	t.Helper()
	err := le.straight.QueryRow("SELECT owner, CAST(expires_at AS CHAR) FROM `"+le.table+"` WHERE name = ? AND kind = 'L'", name).Scan(&owner, &expires)
	if err == sql.ErrNoRows {
		return "", ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return owner, expires
}

// A lateKind is one kind of lease as the late-statement tests use it: a
// lease on one name, a set of two names, or a slot of a semaphore. A
// fourth kind adds a value to lateKinds, and every late test runs on it.
type lateKind struct {
	name string
	// skip skips t where e's server refuses the kind.
	skip func(t *testing.T, e *testEnv)
	// acquire takes, for ttl, the kind's lease on base: base itself, the
	// names base1 and base2, or a slot of a semaphore of n on base.
	acquire func(ctx context.Context, c *Client, base string, n int, ttl time.Duration) (*Lock, error)
	// isAcquire reports whether q, sent with args, is the kind's acquire
	// of base, and not a proof's.
	isAcquire func(le *lateEnv, q string, args []driver.NamedValue, base string) bool
	// isRefresh reports whether q, sent with args, refreshes the lease of
	// token; false while token is "".
	isRefresh func(le *lateEnv, q string, args []driver.NamedValue, token string) bool
}

// isPlainRefresh: a name and a slot are refreshed by the one refresh
// statement, whose third argument is the token.
func isPlainRefresh(le *lateEnv, q string, args []driver.NamedValue, token string) bool {
	return token != "" && le.is(q, qRefresh) && arg(args, 2) == token
}

var lateKinds = []lateKind{
	{
		name: "name",
		skip: func(*testing.T, *testEnv) {},
		acquire: func(ctx context.Context, c *Client, base string, _ int, ttl time.Duration) (*Lock, error) {
			return c.TryAcquire(ctx, base, ttl)
		},
		isAcquire: func(le *lateEnv, q string, args []driver.NamedValue, base string) bool {
			return le.is(q, qAcquire) && arg(args, 0) == base
		},
		isRefresh: isPlainRefresh,
	},
	{
		name: "set",
		skip: skipSetsOnVitess,
		acquire: func(ctx context.Context, c *Client, base string, _ int, ttl time.Duration) (*Lock, error) {
			return c.TryAcquireSet(ctx, []string{base + "1", base + "2"}, ttl)
		},
		// A set's statements carry its names as literals: any set acquire
		// but the proof's is the test's.
		isAcquire: func(_ *lateEnv, q string, _ []driver.NamedValue, _ string) bool {
			return isSetAcquire(q) && !strings.Contains(q, proofLiteral)
		},
		isRefresh: func(_ *lateEnv, q string, _ []driver.NamedValue, token string) bool {
			return token != "" && strings.HasPrefix(q, "UPDATE") && strings.Contains(q, "expires_at = GREATEST(") && strings.Contains(q, hexLiteral(token))
		},
	},
	{
		name: "slot",
		skip: slotServer,
		acquire: func(ctx context.Context, c *Client, base string, n int, ttl time.Duration) (*Lock, error) {
			return c.Semaphore(base, n).TryAcquire(ctx, ttl)
		},
		isAcquire: func(_ *lateEnv, q string, args []driver.NamedValue, _ string) bool {
			return isSlotAcquire(q) && !aboutProof(args)
		},
		isRefresh: isPlainRefresh,
	},
}

// eachLateKind runs f as a subtest per kind of lease, on each test
// environment that every (eachServerEnv) or only the default DSN variant
// (eachEnv) gives, skipped where the kind is refused, with a lateEnv.
func eachLateKind(t *testing.T, each func(*testing.T, func(*testing.T, *testEnv)), f func(t *testing.T, k lateKind, le *lateEnv)) {
	for _, k := range lateKinds {
		t.Run(k.name, func(t *testing.T) {
			each(t, func(t *testing.T, e *testEnv) {
				k.skip(t, e)
				f(t, k, newLateEnv(t, e))
			})
		})
	}
}
