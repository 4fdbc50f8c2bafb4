package sqllock

import (
	"strings"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// What a Client has learned of its server is one immutable value, a forms,
// which the Client holds in an atomic pointer: the statements' text as
// prepared, the flags the text and the reading of answers depend on, and
// which checks and proofs have passed. New stores the forms every server
// starts with; the first-use check replaces them, once, with the server's
// own (chooseForms), and each check or proof that passes makes a new value
// with its mark (learn). A reader loads the pointer once and sees one
// consistent value, with no lock: a check choosing the forms under way
// never shows half of them.
type forms struct {
	sql [numStmts]string // statement text with the table name in place
	// table is the Client's table, quoted, and in its database once the
	// first use found it; name, its own name; db, the database as a
	// string literal, or "" before (sqltext.Forms).
	table, name, db string
	// chosen: the first-use check has chosen these forms.
	chosen bool
	// tidb: the server is TiDB: sql holds its forms.
	tidb bool
	// oneRow: sql holds the one-row forms, TiDB's or Vitess's: a name has
	// no fence row.
	oneRow bool
	// onceByRows: once_record reports by the rows it inserted (once.go).
	onceByRows bool
	// lockWait: MariaDB, whose acquires bound their wait for a row
	// (queries.sql, lock_wait_mariadb).
	lockWait bool
	// mysql: MySQL 8.0 or later itself (not TiDB, not through Vitess),
	// whose lock-wait tables the frozen-holder watch reads (frozen.go).
	mysql bool

	// checked: the first-use check found the table as it should be
	// (tablecheck.go). proven: the proof of the statements passed
	// (proof.go). later: the proof of a kind proven at its own first use
	// passed (proof_later.go).
	checked, proven bool
	later           [numLaterProofs]bool
}

// text returns what sqltext needs of f.
func (f *forms) text() sqltext.Forms {
	return sqltext.Forms{Q: queries, Table: f.table, Name: f.name, DB: f.db, TiDB: f.tidb, OneRow: f.oneRow, LockWait: f.lockWait}
}

// initialForms returns the forms every server starts with, on table
// (quoted), in whichever database a connection has chosen.
func initialForms(table string) *forms {
	f := &forms{table: table, name: strings.Trim(table, "`")}
	t := f.text()
	for i, name := range stmtNames {
		f.sql[i] = t.Substitute(queries[name])
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
func serverForms(table, qualified, db, version string, carries bool) *forms {
	f := initialForms(table)
	f.table, f.db = qualified, db
	f.chosen = true
	t := f.text()
	for i, name := range stmtNames {
		f.sql[i] = t.Substitute(queries[name])
	}
	switch {
	case strings.Contains(version, "TiDB"):
		f.tidb, f.oneRow = true, true
		t := f.text()
		for _, i := range tidbStmts {
			f.sql[i] = t.Substitute(queries[tidbPrefix+stmtNames[i]])
		}
	case !carries && !strings.Contains(version, "MariaDB"):
		// Not behind MariaDB: under its SIMULTANEOUS_ASSIGNMENT the one-row
		// acquire's last assignment would not see the new owner, and a
		// takeover would leave the lease expired. There the two-row forms
		// stay, and the proof refuses them.
		f.oneRow, f.onceByRows = true, true
		t := f.text()
		for _, i := range tidbStmts {
			if i != qOnceRecord { // the plain once_record reads the one row as well
				f.sql[i] = t.Substitute(strings.ReplaceAll(queries[tidbPrefix+stmtNames[i]], tidbHint, ""))
			}
		}
	case strings.Contains(version, "MariaDB"):
		f.lockWait = true
		f.sql[qAcquire] = queries["lock_wait_mariadb"] + "\n" + f.sql[qAcquire]
	case strings.HasPrefix(version, "5."):
	default:
		f.mysql = true
	}
	return f
}

// learned returns the forms the Client holds now.
func (c *Client) learned() *forms { return c.forms.Load() }

// learn puts in place a copy of the Client's forms that change made,
// unless change reports that it changed nothing. change may run more than
// once, when another call learns something at the same time.
func (c *Client) learn(change func(f *forms) bool) {
	for {
		cur := c.forms.Load()
		next := *cur
		if !change(&next) || c.forms.CompareAndSwap(cur, &next) {
			return
		}
	}
}

// mark sets, in a new value, the flag of the Client's forms that flag
// points to: a check or a proof that passed.
func (c *Client) mark(flag func(f *forms) *bool) {
	c.learn(func(f *forms) bool {
		p := flag(f)
		changed := !*p
		*p = true
		return changed
	})
}

// chooseForms puts the server's forms of the statements in place, before
// any is prepared, once: a second call (another call's check got here
// first) changes nothing. On TiDB and Vitess the wake-up channels stay
// off: TiDB's GET_LOCK, built on its own transactions, neither granted
// waiters in the order they came nor freed a killed connection's lock at
// once in the tests (wake_test.go); vtgate runs every locking function of
// a session on a connection it reserves on one shard, and the tests that
// would show the channels right read the processlist and KILL connections,
// which vtgate does not pass on. Waiters poll there.
func (c *Client) chooseForms(version, qualified, db string, carries bool) {
	c.learn(func(f *forms) bool {
		if f.chosen {
			return false // another call's check chose them first
		}
		s := serverForms(c.table, qualified, db, version, carries)
		s.checked, s.proven, s.later = f.checked, f.proven, f.later
		*f = *s
		return true
	})
	f := c.learned()
	if f.oneRow {
		c.wait.Channels.Refuse()
	}
	if f.oneRow || !f.lockWait && !f.mysql {
		// Said once, as the watch's own refusal is (frozen.go).
		c.frozen.warned.Do(func() {
			c.frozen.off.Store(true)
			c.log.Info("sqllock: a holder frozen inside Lock.Check is not ended on this server (TiDB, Vitess, MySQL 5.7): "+
				"its lease row stays locked until the server ends its transaction (TiDB's tidb_idle_transaction_timeout, "+
				"vttablet's transaction timeout, wait_timeout); see docs/guarantees.md", "version", version)
		})
	}
}
