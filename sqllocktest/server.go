package sqllocktest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"
)

// Version is what the fake answers to VERSION(): a MySQL 8.4, so a Client
// sends MySQL's forms of its statements (the fake refuses MariaDB's and
// TiDB's, as MySQL would).
const Version = "8.4.0-sqllocktest"

// MariaDBVersion is what a fake made [WithMariaDB] answers to VERSION(): a
// MariaDB 10.11, so a Client sends MariaDB's forms of its statements.
const MariaDBVersion = "10.11.0-MariaDB-sqllocktest"

// Database is what the fake answers to DATABASE().
const Database = "sqllocktest"

// DefaultTable is the table New creates: the library's default.
const DefaultTable = "sqllock"

// DefaultLockWaitTimeout is how long a statement waits for a row that
// another connection's open transaction has locked (a Lock.Check's) before
// it fails with error 1205, as InnoDB's innodb_lock_wait_timeout.
const DefaultLockWaitTimeout = 50 * time.Second

// A Server is an in-memory stand-in for a MySQL server (or MariaDB,
// [WithMariaDB]) that runs exactly the statements sqllock sends, for tests
// of code that uses the library: hand [Server.DB] to sqllock.New. Its clock is the test's ([Server.Advance]),
// and its faults are the test's to inject ([Server.Inject], [Server.Expire],
// [Server.Down]). It is safe for concurrent use by any number of
// connections and Clients. The zero value is not usable: call [New] or
// [NewServer].
type Server struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced when a lock is freed, the clock moves or the server goes down

	version  string
	mariadb  bool // WithMariaDB: MariaDB's forms and answers
	frozenAt time.Time
	offset   time.Duration
	noLocks  bool // GET_LOCK is refused
	lockWait time.Duration
	handler  Handler // answers the SQL that is not sqllock's

	tables map[string]*table
	rowLks map[rowRef]*conn // rows locked by open transactions
	named  map[string]*namedLock
	conns  map[*conn]bool
	nextID int64
	down   bool
	closed bool
	faults []Fault
	counts map[string]int
	dbs    []*sql.DB   // DB's, closed by Close
	undo   []undoEntry // the running statement's writes
}

// An Option changes a Server from its defaults.
type Option func(*Server) error

// WithFrozenClock stops the server's clock at start (the machine's clock
// when start is zero): it moves only by [Server.Advance], so a lease expires
// exactly when the test says. Without it the clock runs with the machine's.
func WithFrozenClock(start time.Time) Option {
	return func(s *Server) error {
		if start.IsZero() {
			start = time.Now()
		}
		s.frozenAt = start.Truncate(time.Microsecond)
		return nil
	}
}

// WithoutGetLock makes the server refuse GET_LOCK as MariaDB Galera does,
// with error 1235: a Client then keeps no wake-up channels, and waiting
// Acquires poll.
func WithoutGetLock() Option {
	return func(s *Server) error {
		s.noLocks = true
		return nil
	}
}

// WithMariaDB makes the server answer as MariaDB 10.11 does, where it and
// MySQL 8.4 differ: VERSION() says MariaDB ([MariaDBVersion]), so a Client
// sends MariaDB's forms, whose acquires (a name's, a set's, a semaphore's)
// wait at most a second for a row another connection's transaction holds
// (a Lock.Check's) and then fail with error 1205, which the Client reports
// as the name held; the session guard's MariaDB part fails a statement that
// takes or extends a lease inside an open transaction (@@in_transaction,
// error 1690); and information_schema and errors read as MariaDB's. Without
// it the server answers as MySQL 8.4 does.
func WithMariaDB() Option {
	return func(s *Server) error {
		s.version, s.mariadb = MariaDBVersion, true
		return nil
	}
}

// WithLockWaitTimeout sets how long a statement waits for a row another
// connection's transaction holds before error 1205 (DefaultLockWaitTimeout),
// as innodb_lock_wait_timeout; MariaDB's acquires wait the second their
// statement sets instead ([WithMariaDB]).
func WithLockWaitTimeout(d time.Duration) Option {
	return func(s *Server) error {
		if d <= 0 {
			return fmt.Errorf("sqllocktest: WithLockWaitTimeout(%v): want a positive duration", d)
		}
		s.lockWait = d
		return nil
	}
}

// NewServer returns a Server with the library's default table (sqllock)
// created. Close it when done.
func NewServer(opts ...Option) (*Server, error) {
	s := &Server{
		changed:  make(chan struct{}),
		version:  Version,
		lockWait: DefaultLockWaitTimeout,
		tables:   map[string]*table{},
		rowLks:   map[rowRef]*conn{},
		named:    map[string]*namedLock{},
		conns:    map[*conn]bool{},
		counts:   map[string]int{},
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("sqllocktest: NewServer: nil Option")
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	s.tables[DefaultTable] = newTable()
	return s, nil
}

// New returns a Server as [NewServer] does, closed (with the *sql.DBs it
// handed out) when t's test ends. A bad Option fails t.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := NewServer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// DB returns a new *sql.DB whose connections are the server's, as another
// process's pool would be: give it to sqllock.New. Closing the Server
// closes it too.
func (s *Server) DB() *sql.DB {
	db := sql.OpenDB(s.Connector())
	s.mu.Lock()
	s.dbs = append(s.dbs, db)
	s.mu.Unlock()
	return db
}

// Connector returns a database/sql/driver Connector whose connections are
// the server's.
func (s *Server) Connector() driver.Connector { return connector{s} }

// CreateTable creates a table as schema.sql describes, as sqllock's
// Client.CreateTable would; a table that is there already is no error. It
// returns an error for a name sqllock.WithTable would refuse.
func (s *Server) CreateTable(name string) error {
	if !validTable(name) {
		return fmt.Errorf("sqllocktest: CreateTable(%q): want 1 to 64 of A-Z, a-z, 0-9 and _, as sqllock.WithTable", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tables[name] == nil {
		s.tables[name] = newTable()
	}
	return nil
}

// Close takes the server down for good: every connection breaks, and no new
// one opens. It is safe to call more than once.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.goDown()
	dbs := s.dbs
	s.dbs = nil
	s.mu.Unlock()
	for _, db := range dbs {
		db.Close()
	}
}

// Down takes the server down, as a crash would: every connection breaks
// (a statement under way fails as a lost connection, its outcome left as
// it was; open transactions roll back; GET_LOCK locks are freed), and
// connecting fails with "connection refused" until [Server.Up]. The tables
// keep every committed row.
func (s *Server) Down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.goDown()
}

// Up brings the server back after [Server.Down].
func (s *Server) Up() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = false
}

func (s *Server) goDown() {
	s.down = true
	for c := range s.conns {
		s.breakConn(c)
	}
	s.broadcast()
}

// Expire ends the lease on name now, in every table that has one, by the
// server's clock: the next acquire of the name takes it over, and the
// holder's refresh and Check find it lost. It returns an error when no table
// holds a lease row for name.
func (s *Server) Expire(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowMicros()
	found := false
	expire := func(r *row) {
		if r != nil && r.expires > now {
			r.expires = now
		}
	}
	for _, tname := range s.tableNames() {
		ref := rowRef{tname, rowKey{name, 'L'}}
		if r := s.tables[tname].rows[ref.key]; r != nil {
			found = true
			expire(r)
		}
		// A Check's transaction holding the row: what others read of it,
		// and what a rollback puts back, has expired too.
		if h := s.rowLks[ref]; h != nil && h.tx != nil {
			found = found || h.tx.before[ref] != nil
			expire(h.tx.before[ref])
		}
	}
	if !found {
		return fmt.Errorf("sqllocktest: Expire(%q): no table holds a lease on that name", name)
	}
	s.broadcast()
	return nil
}

// Count returns how many times the server has run the statement of
// queries.sql called name ("acquire", "refresh", "release", ...): each
// execution, including those a fault failed. It returns -1 for a name the
// fake does not know.
func (s *Server) Count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range statementNames() {
		if n == name {
			return s.counts[name]
		}
	}
	return -1
}

func (s *Server) tableNames() []string {
	names := make([]string, 0, len(s.tables))
	for n := range s.tables {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// broadcast wakes every statement that waits on the server; s.mu is held.
func (s *Server) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// wait releases s.mu until something changes on the server, ctx ends or
// deadline passes (never, when zero), and takes it again. It reports why
// it returned: nil, ctx's error, or errTimedOut.
func (s *Server) wait(ctx context.Context, deadline time.Time) error {
	ch := s.changed
	s.mu.Unlock()
	defer s.mu.Lock()
	var timer <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return errTimedOut
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer:
		return errTimedOut
	}
}
