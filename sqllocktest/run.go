package sqllocktest

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// A call is one execution of a statement.
type call struct {
	s     *Server
	c     *conn
	ctx   context.Context
	p     *parsed
	args  []driver.Value
	now   int64 // the server's clock, fixed for the statement
	table *table
}

// An outcome is what a statement sends back: rows, or an OK packet.
type outcome struct {
	cols     []string
	rows     [][]driver.Value
	lastID   uint64
	affected int64
}

// A handler runs one statement of queries.sql (or of the fake's own).
type handler struct {
	needsTable bool // the statement names a table that must exist
	writes     bool // refused in a read-only transaction
	// guardFirst: the statement evaluates the session guard before it
	// reads a row (acquires, all_refresh); the others' handlers call
	// guard for each row that meets the WHERE before the guard's term.
	guardFirst bool
	locks      func(x *call) []rowRef // rows it writes or reads FOR UPDATE, waited for
	run        func(x *call) (*outcome, error)
}

// execute runs a parsed statement on connection c, with its injected fault
// if one is queued.
func (s *Server) execute(ctx context.Context, c *conn, p *parsed, args []driver.Value) (*outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.broken {
		return nil, driver.ErrBadConn // nothing was sent: database/sql tries another connection
	}
	name := p.t.name
	s.counts[name]++
	f, faulty := s.takeFault(name)
	if faulty && !f.Applied {
		return nil, s.fail(c, f.Err)
	}
	out, err := s.run(ctx, c, p, args)
	if faulty && err == nil {
		return nil, s.fail(c, f.Err)
	}
	return out, err
}

// fail returns an injected error; a lost connection breaks c.
func (s *Server) fail(c *conn, err error) error {
	if errors.Is(err, ErrLostConnection) {
		s.breakConn(c)
		return ErrLostConnection
	}
	var se ServerError
	if errors.As(err, &se) && se.Number == Deadlock.Number {
		s.endTx(c, false) // a deadlock rolls the whole transaction back
	}
	return err
}

// run runs the statement, waiting while another transaction holds a row it
// needs, as InnoDB does; s.mu is held.
func (s *Server) run(ctx context.Context, c *conn, p *parsed, args []driver.Value) (*outcome, error) {
	h := handlers[p.t.name]
	lockWait := s.lockWait
	if p.t.mariadb {
		if !s.mariadb {
			// MySQL has no SET STATEMENT; a Client sends it only to a
			// server that says it is MariaDB.
			return nil, errSyntax("STATEMENT innodb_lock_wait_timeout = 1 FOR INSERT INTO `" + p.table + "`")
		}
		lockWait = mariadbLockWait
	}
	if h.writes && c.tx != nil && c.tx.readOnly {
		return nil, errReadOnlyTx
	}
	var deadline time.Time
	for {
		x := &call{s: s, c: c, ctx: ctx, p: p, args: args, table: s.tables[p.table]}
		if h.needsTable && x.table == nil {
			return nil, errNoTable(p.table)
		}
		if h.guardFirst {
			// The guard sits in the first row's VALUES (or a WHERE that
			// every row meets), evaluated before any row lock is taken.
			if err := x.guard(); err != nil {
				return nil, err
			}
		}
		var refs []rowRef
		if h.locks != nil {
			refs = h.locks(x)
		}
		b := s.blocker(c, refs)
		if b == nil {
			x.now = s.nowMicros()
			s.undo = s.undo[:0]
			out, err := h.run(x)
			if err != nil && h.writes {
				// Only a statement that writes has anything to undo. One
				// that does not may have waited inside run (GET_LOCK lets
				// go of s.mu while it waits), and s.undo is then another
				// statement's, long committed.
				s.undoStatement()
			}
			return out, err
		}
		for w := b; w != nil; w = w.waitingFor {
			if w == c {
				s.endTx(c, false)
				return nil, Deadlock
			}
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(lockWait)
		}
		c.waitingFor = b
		err := s.wait(ctx, deadline)
		c.waitingFor = nil
		switch {
		case c.broken:
			return nil, ErrLostConnection
		case errors.Is(err, errTimedOut):
			return nil, LockWaitTimeout // the statement alone is undone
		case err != nil:
			// go-sql-driver/mysql closes the connection when the
			// context ends under a statement.
			s.breakConn(c)
			return nil, err
		}
	}
}

// guard is the session guard's MariaDB part (queries.sql), evaluated: on
// MariaDB, a statement that carries it fails inside an open transaction
// (@@in_transaction), with nothing written. MySQL reads the part as a
// comment, and its @@autocommit is 1 inside a transaction.
func (x *call) guard() error {
	if x.s.mariadb && x.c.tx != nil && x.p.t.guarded {
		return errInTransaction
	}
	return nil
}

// Argument readers: the library binds names, tokens and holders as strings
// and lengths as int64; database/sql may hand bytes or unsigned numbers.
func (x *call) str(i int) (string, error) {
	if i >= len(x.args) {
		return "", fmt.Errorf("sqllocktest: %s: want an argument %d, got %d arguments", x.p.t.name, i+1, len(x.args))
	}
	switch v := x.args[i].(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case nil:
		return "", errNull("name")
	}
	return fmt.Sprint(x.args[i]), nil
}

func (x *call) int(i int) (int64, error) {
	if i >= len(x.args) {
		return 0, fmt.Errorf("sqllocktest: %s: want an argument %d, got %d arguments", x.p.t.name, i+1, len(x.args))
	}
	switch v := x.args[i].(type) {
	case int64:
		return v, nil
	case uint64:
		if v > 1<<63-1 {
			return 0, fmt.Errorf("sqllocktest: %s: argument %d, %d, is out of range", x.p.t.name, i+1, v)
		}
		return int64(v), nil
	}
	return 0, fmt.Errorf("sqllocktest: %s: argument %d is %T, want a whole number", x.p.t.name, i+1, x.args[i])
}

// strs reads the arguments at the given indexes as strings.
func (x *call) strs(idx ...int) ([]string, error) {
	out := make([]string, len(idx))
	for j, i := range idx {
		v, err := x.str(i)
		if err != nil {
			return nil, err
		}
		out[j] = v
	}
	return out, nil
}

func (x *call) ref(name string, kind byte) rowRef {
	return rowRef{x.p.table, rowKey{name, kind}}
}

// refsOf locks the rows of name of the given kinds; an argument that is
// missing locks nothing, and run reports it.
func refsOf(arg int, kinds string) func(x *call) []rowRef {
	return func(x *call) []rowRef {
		name, err := x.str(arg)
		if err != nil {
			return nil
		}
		var refs []rowRef
		for i := 0; i < len(kinds); i++ {
			refs = append(refs, x.ref(name, kinds[i]))
		}
		return refs
	}
}

// plus adds an interval of us microseconds to a DATETIME(6): NULL (an
// error in a NOT NULL column) past year 9999 or before year 1000, as MySQL.
func plus(t, us int64, column string) (int64, error) {
	const minDatetime, maxDatetime = -30610224000000000, 253402300799999999
	v := t + us
	if (us > 0 && v < t) || (us < 0 && v > t) || v < minDatetime || v > maxDatetime {
		return 0, errNull(column)
	}
	return v, nil
}

// Values as the binary protocol hands them to database/sql.
func fenceValue(f uint64) driver.Value {
	if f > 1<<63-1 {
		return []byte(fmt.Sprint(f))
	}
	return int64(f)
}

func boolValue(b bool) driver.Value {
	if b {
		return int64(1)
	}
	return int64(0)
}
