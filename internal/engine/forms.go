package engine

import (
	"database/sql"
	"fmt"
	"math"
	"strings"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// What a Client has learned of its server is one immutable value, a Forms,
// which the Server holds in an atomic pointer: the statements' text as
// prepared, the flags the text and the reading of answers depend on, and
// which checks and proofs have passed. New stores the forms every server
// starts with; the first-use check replaces them, once, with the server's
// own (Choose), and each check or proof that passes makes a new value with
// its mark (Learn). A reader loads the pointer once and sees one consistent
// value, with no lock: a check choosing the forms under way never shows
// half of them.
type Forms struct {
	SQL [NumStmts]string // statement text with the table name in place
	// Table is the Client's table, quoted, and in its database once the
	// first use found it; Name, its own name; DB, the database as a string
	// literal, or "" before (sqltext.Forms).
	Table, Name, DB string
	// Chosen: the first-use check has chosen these forms.
	Chosen bool
	// TiDB: the server is TiDB: SQL holds its forms.
	TiDB bool
	// OneRow: SQL holds the one-row forms, TiDB's or Vitess's: a name has
	// no fence row.
	OneRow bool
	// OnceByRows: once_record reports by the rows it inserted (once.go).
	OnceByRows bool
	// LockWait: MariaDB, whose acquires bound their wait for a row
	// (queries.sql, lock_wait_mariadb).
	LockWait bool
	// MySQL: MySQL 8.0 or later itself (not TiDB, not through Vitess),
	// whose lock-wait tables the frozen-holder watch reads (frozen.go).
	MySQL bool
	// LargeIn: MySQL 8.0 and later, or MariaDB 10.5.9 and later, which
	// read an IN list of tens of thousands of names by key when told to
	// (queries.sql, renew_many): a shared renewal carries more leases
	// there (RenewLimits).
	LargeIn bool

	// Checked: the first-use check found the table as it should be
	// (tablecheck.go). Proven: the proof of the statements passed
	// (proof.go). Later: the proof of a kind proven at its own first use
	// passed (later.go: sets, semaphores, Once, sessions).
	Checked, Proven bool
	Later           [NumLater]bool

	q sqltext.Statements
}

// NumLater is how many kinds are proven at their own first use.
const NumLater = 4

// Text returns what sqltext needs of f.
func (f *Forms) Text() sqltext.Forms {
	return sqltext.Forms{Q: f.q, Table: f.Table, Name: f.Name, DB: f.DB, TiDB: f.TiDB, OneRow: f.OneRow, LockWait: f.LockWait, MySQL: f.MySQL}
}

// OneRowStmts are the statements with a one-row form (TiDB's, tidb_… in
// queries.sql); the rest serve every server as they are.
var OneRowStmts = []int{Acquire, Refresh, Release, Inspect, ReleaseAtLeast, List, Lease, OnceRecord, LockDelay}

// initialForms returns the forms every server starts with, of the
// statements q, on table (quoted), in whichever database a connection has
// chosen.
func initialForms(q sqltext.Statements, table string) *Forms {
	f := &Forms{Table: table, Name: strings.Trim(table, "`"), q: q}
	t := f.Text()
	for i, name := range Names {
		f.SQL[i] = t.Substitute(q[name])
	}
	return f
}

// serverForms returns the forms of the server that answered version, on
// table (quoted) in database db (its qualified name and its literal,
// sqltext.Qualify): every statement names the table in that database, so
// that a USE the application runs on a connection of the pool moves no
// lease elsewhere. carries says whether LAST_INSERT_ID() there carried the
// value its own statement set (the first-use check). On TiDB: its
// LAST_INSERT_ID() does not see a value set earlier in the same
// statement, which the two-row acquire relies on (queries.sql), so a name
// has one row there. Elsewhere, where the first-use check saw
// LAST_INSERT_ID() miss the value its own statement set (Vitess, whose
// vtgate puts its session's value in its place, in front of MySQL), the
// same one-row forms, without TiDB's hint. The proof then holds them to
// what they must report (proof.go). On MariaDB: the acquire waits at most
// a second for its row (queries.sql, lock_wait_mariadb).
func serverForms(q sqltext.Statements, table, qualified, db, version string, carries bool) *Forms {
	f := initialForms(q, table)
	f.Table, f.DB = qualified, db
	f.Chosen = true
	t := f.Text()
	for i, name := range Names {
		f.SQL[i] = t.Substitute(q[name])
	}
	switch {
	case strings.Contains(version, "TiDB"):
		f.TiDB, f.OneRow = true, true
		t := f.Text()
		for _, i := range OneRowStmts {
			f.SQL[i] = t.Substitute(q[sqltext.TiDBPrefix+Names[i]])
		}
	case !carries && !strings.Contains(version, "MariaDB"):
		// Not behind MariaDB: under its SIMULTANEOUS_ASSIGNMENT the one-row
		// acquire's last assignment would not see the new owner, and a
		// takeover would leave the lease expired. There the two-row forms
		// stay, and the proof refuses them.
		f.OneRow, f.OnceByRows = true, true
		t := f.Text()
		for _, i := range OneRowStmts {
			if i != OnceRecord { // the plain once_record reads the one row as well
				f.SQL[i] = t.Substitute(strings.ReplaceAll(q[sqltext.TiDBPrefix+Names[i]], sqltext.TiDBHint, ""))
			}
		}
	case strings.Contains(version, "MariaDB"):
		f.LockWait = true
		f.LargeIn = mariaDBAtLeast(version, 10, 5, 9)
		f.SQL[Acquire] = q["lock_wait_mariadb"] + "\n" + f.SQL[Acquire]
		f.SQL[AcquireAttached] = q["lock_wait_mariadb"] + "\n" + f.SQL[AcquireAttached]
	case strings.HasPrefix(version, "5."):
	default:
		f.MySQL, f.LargeIn = true, true
	}
	return f
}

// Forms returns the forms the Server holds now.
func (s *Server) Forms() *Forms { return s.forms.Load() }

// Text returns what the text of the statements depends on, as the first use
// has found it so far.
func (s *Server) Text() sqltext.Forms { return s.Forms().Text() }

// Learn puts in place a copy of the forms that change made, unless change
// reports that it changed nothing. change may run more than once, when
// another call learns something at the same time.
func (s *Server) Learn(change func(f *Forms) bool) {
	for {
		cur := s.forms.Load()
		next := *cur
		if !change(&next) || s.forms.CompareAndSwap(cur, &next) {
			return
		}
	}
}

// Mark sets, in a new value, the flag of the forms that flag points to: a
// check or a proof that passed.
func (s *Server) Mark(flag func(f *Forms) *bool) {
	s.Learn(func(f *Forms) bool {
		p := flag(f)
		changed := !*p
		*p = true
		return changed
	})
}

// Choose puts the forms of the server that answered version in place,
// before any statement is prepared, once: a later call (another call's
// check got here first) changes nothing. It returns the forms now held.
func (s *Server) Choose(version, qualified, db string, carries bool) *Forms {
	s.Learn(func(f *Forms) bool {
		if f.Chosen {
			return false // another call's check chose them first
		}
		n := serverForms(f.q, s.cfg.Table, qualified, db, version, carries)
		n.Checked, n.Proven, n.Later = f.Checked, f.Proven, f.Later
		*f = *n
		return true
	})
	return s.Forms()
}

// OnceRecorded reads once_record's answer res: the insert id, or, where
// the insert id is lost on the way (OnceByRows: Vitess's vtgate runs the
// INSERT ... SELECT of a sharded keyspace as a SELECT ... FOR UPDATE and
// an INSERT in one transaction on the name's shard), the rows inserted
// (queries.sql, once_record).
func (f *Forms) OnceRecorded(res sql.Result) (int64, error) {
	id, err := res.LastInsertId()
	if err == nil && f.OnceByRows {
		id, err = res.RowsAffected()
	}
	return id, err
}

// MaxTiDBFence is where fences end on TiDB: its LAST_INSERT_ID(expr) takes
// a signed 64-bit value, and a refresh sets the fence plus one. Fences start
// at the clock in microseconds (about 2^51) and grow by one per acquire.
const MaxTiDBFence = math.MaxInt64 - 1

// FenceBeyond says why fence, an acquire's answer, is past the largest the
// server takes, or "". TiDB's LAST_INSERT_ID(expr) takes a signed value:
// past it, the acquire fails (1690), or under a lenient sql_mode reports
// the largest signed value, which may be below the fence it wrote.
func (f *Forms) FenceBeyond(fence uint64) string {
	if f.TiDB && fence > MaxTiDBFence {
		return fmt.Sprintf("the fence reached TiDB's largest, %d", uint64(MaxTiDBFence))
	}
	return ""
}

// Channels reports whether the wake-up channels (GET_LOCK) serve here: not
// on TiDB, whose GET_LOCK, built on its own transactions, neither granted
// waiters in the order they came nor freed a killed connection's lock at
// once in the tests; not through Vitess, whose vtgate runs every locking
// function of a session on a connection it reserves on one shard, and does
// not pass on the processlist reads and KILLs the tests that would show
// them right make. Waiters poll there.
func (f *Forms) Channels() bool { return !f.OneRow }

// EndsFrozen reports whether a holder frozen inside Lock.Check can be ended
// here: on MariaDB and on MySQL 8.0 or later itself, whose lock-wait
// tables name the blocking connection (frozen.go); not on TiDB, through
// Vitess or on MySQL 5.7.
func (f *Forms) EndsFrozen() bool { return !f.OneRow && (f.LockWait || f.MySQL) }

// RefusesSets reports whether sets are refused here: through Vitess (the
// one-row forms, not TiDB's), a set's names may live on different shards.
func (f *Forms) RefusesSets() bool { return f.OneRow && !f.TiDB }

// SlotsRefusal says why counting semaphores are refused here, or "".
func (f *Forms) SlotsRefusal() string {
	switch {
	case f.TiDB:
		return "counting semaphores are not available on TiDB: its LAST_INSERT_ID() does not carry a value from one row of a statement to the next, which taking a slot in one statement needs"
	case f.OneRow:
		return "counting semaphores are not available through this server (Vitess, or a proxy that rewrites LAST_INSERT_ID()): LAST_INSERT_ID() does not carry a value from one row of a statement to the next, which taking a slot in one statement needs"
	}
	return ""
}
