package engine

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// The row lock between connections, proven at first use: everything a
// lease promises rests on it. On conn1, inside a transaction, the acquire
// takes the proof name under token a; on conn2, the acquire under token b
// must not report the name taken while that transaction can still commit.
// MySQL and MariaDB make it wait for the row lock (MariaDB's acquire at
// most a second, lock_wait_mariadb), and once conn1 commits it reports
// refused. An engine that runs transactions optimistically may let conn2
// take the name first, if it then fails conn1's commit (a conflict: 1213,
// 9007, 3101): one owner still. An answer "taken" on conn2 while conn1's
// transaction commits too is two owners: s.cfg.Errors.Unsupported.
//
// conn2's answer is awaited for a short time only, measured from the round
// trips of the two connections (concurrencyWait), then conn1 commits: the
// proof never waits out a lock wait timeout. An engine that takes no row
// lock answers in one round trip, well within that time.

// concurrencyWait bounds how long conn2's acquire is given to answer while
// conn1's transaction is open: ten of the round trips measured (a query on
// conn2, the acquire on conn1), at least minConcurrencyWait, at most
// maxConcurrencyWait.
func concurrencyWait(rtt, acquire time.Duration) time.Duration {
	return min(max(10*(rtt+acquire), minConcurrencyWait), maxConcurrencyWait)
}

const (
	minConcurrencyWait = 10 * time.Millisecond
	maxConcurrencyWait = 500 * time.Millisecond
)

// inTransactionGuard is the part of the session guard (queries.sql,
// session.go) that refuses, on MariaDB, an acquire inside an open
// transaction. The row lock's proof sends the acquire inside one on
// purpose, on a connection of its own that it commits itself, so there it
// sends the acquire without that part (inTransaction).
const inTransactionGuard = " /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */"

// inTransaction returns the acquire text for the row lock's transaction.
func inTransaction(acquire string) string {
	return strings.Replace(acquire, inTransactionGuard, "", 1)
}

// A preparer prepares a statement: a *sql.Conn or a *sql.Tx.
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// proofAcquire sends the acquire text on p under token for ttl µs (which
// may be negative: a lease already expired) and returns its insert id.
func (s *Server) proofAcquire(ctx context.Context, p preparer, text, name, token string, us int64) (uint64, error) {
	id, err := preparedExec(ctx, p, text, s.acquireArgs(name, token, us)...)
	return uint64(id), err
}

// preparedExec prepares query on p and runs it with args, as the Client
// sends its statements (a DSN's interpolateParams sends an Exec with
// arguments as text, which a layer may treat otherwise: MySQL Router with
// connection sharing refuses some functions in text), and returns its
// insert id.
func preparedExec(ctx context.Context, p preparer, query string, args ...any) (int64, error) {
	st, err := p.PrepareContext(ctx, query)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// proveConcurrency proves the row lock on conn1 and conn2, whose round trip
// took rtt, under name, which must be free. It returns the token that holds
// the name's lease afterwards.
func (s *Server) proveConcurrency(ctx context.Context, conn1, conn2 *sql.Conn, rtt time.Duration, text *[NumStmts]string, version, name, a, b string) (string, error) {
	us := proofTTL.Microseconds()
	var (
		tx    *sql.Tx
		fence uint64
		took  time.Duration
	)
	// A rollback (a deadlock, a cluster conflict) ends the transaction:
	// it begins again.
	err := fault.RetryRolledBack(ctx, func() error {
		var err error
		if tx, err = conn1.BeginTx(ctx, nil); err != nil {
			return err
		}
		start := time.Now()
		fence, err = s.proofAcquire(ctx, tx, inTransaction(text[Acquire]), name, a, us)
		took = time.Since(start)
		if err != nil {
			_ = tx.Rollback()
		}
		return err
	})
	if err != nil {
		return "", err
	}
	if fence <= 2 {
		_ = tx.Rollback()
		return "", s.refuseServer(version, "an acquire of a free name inside a transaction reported %d instead of a fence", fence)
	}

	type answer struct {
		id  uint64
		err error
	}
	answers := make(chan answer, 1)
	go func() {
		id, err := s.proofAcquire(ctx, conn2, text[Acquire], name, b, us)
		answers <- answer{id, err}
	}()
	var early *answer
	t := time.NewTimer(concurrencyWait(rtt, took))
	select {
	case r := <-answers:
		early = &r
	case <-t.C:
	}
	t.Stop()
	commitErr := tx.Commit()
	r := early
	if r == nil {
		late := <-answers // ctx ends it, if nothing else does
		r = &late
	}

	switch {
	case commitErr != nil && !s.undone(commitErr):
		return "", commitErr
	case r.err != nil && !s.undone(r.err):
		return "", r.err
	case r.err == nil && r.id > 2 && commitErr == nil:
		when := "once the first had committed"
		if early != nil {
			when = "while the first's transaction was still open"
		}
		return "", s.refuseServer(version, "two connections both took one name: an acquire inside a transaction took it (fence %d), "+
			"an acquire on another connection reported it taken too (fence %d) %s, and the first transaction's commit succeeded: "+
			"the second read the row as free instead of waiting for the first's row lock", fence, r.id, when)
	case r.err == nil && r.id > 0 && r.id <= 2:
		return "", s.refuseServer(version, "an acquire of a name another connection's transaction held reported %d, neither a fence nor refused", r.id)
	case commitErr != nil:
		// An optimistic engine: the second took the name, and the first's
		// commit failed with a conflict.
		if r.err == nil && r.id > 2 {
			return b, nil
		}
		return "", nil // neither holds it: both were undone
	}
	return a, nil
}

// undone reports whether err is the server's answer that a statement, or a
// commit, changed nothing: a rollback (a row lock waited out, a conflict),
// or any error of the server's but one whose outcome is unknown. An
// engine may refuse the second acquire otherwise than MySQL does (a
// duplicate key, say): it did not take the name.
func (s *Server) undone(err error) bool {
	_, ok := fault.Errno(err)
	return ok && s.cfg.Classify(err) != fault.Unknown
}
