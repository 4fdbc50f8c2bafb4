package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// A holder stopped inside its Lock.Check transaction (SIGSTOP, a paused
// VM, a debugger) keeps its lease row locked until the server ends the
// transaction, which for an idle connection is wait_timeout (8 h by
// default): every acquire of the name waits behind the row, though the
// lease has ended by the server's clock, and when the holder continues,
// its write commits (queries.sql, "A frozen holder"). So an acquire of a
// name whose statement has not answered within frozenLook watches the
// lease from another connection while it waits: once the lease has been
// over for frozenAfter and an idle transaction still holds its row, the
// Client kills that transaction's connection, found in the server's
// lock-wait tables. The transaction rolls back, and the acquire, still
// waiting, goes on and decides as it always does. The watch lives inside
// the acquire's send and has ended when the send returns.

// frozenAfter is how long past a lease's end, by the server's clock, a
// transaction may keep the lease row locked before the Client ends it. A
// transaction holding the row stops its own holder's renewals too, so a
// Check transaction that outlives the lease has lost it already; the bound
// only lets a commit that was on its way at the end land. With the watch
// looking within frozenLook of a blocked send, a new holder took over
// within ttl + 1.6 s of a stop in the runs docs/guarantees.md reports.
const frozenAfter = 500 * time.Millisecond

// frozenLook is how long an acquire's statement waits for its answer
// before the watch first reads the lease: an acquire that is not blocked
// answers in milliseconds.
const frozenLook = 100 * time.Millisecond

// frozenResends bounds how many times one send of an acquire is sent again
// at once, on MariaDB, after it stopped waiting for its row (1205) behind a
// lease that has ended: its bound of a second (lock_wait_mariadb) may end
// the wait before the row's blocker is due to be ended, and the lock-wait
// tables name a blocker only while a transaction waits.
const frozenResends = 3

// frozenState is what a Server knows of ending frozen holders: whether it
// can (off, once it found it cannot), and whether it has said why not.
type frozenState struct {
	off    atomic.Bool
	warned sync.Once
	// look replaces frozenLook when not 0 (SetFrozenLook).
	look atomic.Int64
}

// A frozenWatch watches one send of an acquire of name (see the top of
// this file). Its timer starts the watch after frozenLook; stop ends it.
type frozenWatch struct {
	s      *Server
	name   string
	parent context.Context
	timer  *time.Timer
	wg     sync.WaitGroup // done when the watch has ended, once started

	mu      sync.Mutex
	stopped bool
	cancel  context.CancelFunc

	resend bool // written before wg is done
}

func (w *frozenWatch) run() {
	defer w.wg.Done()
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(w.parent)
	w.cancel = cancel
	w.mu.Unlock()
	defer cancel()
	w.resend = w.s.endFrozen(ctx, w.name)
}

// endFrozen reads name's lease until it has been over for frozenAfter,
// sleeping until then, and then ends the transactions that hold its row
// locked, until ctx ends (the acquire has its answer). It reports whether
// the lease was over (or ending) when it last looked and the Client can
// still end its row's blockers.
func (s *Server) endFrozen(ctx context.Context, name string) (over bool) {
	for {
		var holder string
		var past int64 // µs since the lease ended
		err := s.cfg.DB.QueryRowContext(ctx, s.Text().Substitute(s.cfg.Queries["frozen_lease"]), name).Scan(&holder, &past)
		if err != nil {
			return false // no lease (released meanwhile), or the acquire answered
		}
		// Over, or ending within MariaDB's wait for the row (a second):
		// a send again waits for the row while its blocker becomes due.
		over = past >= -time.Second.Microseconds()
		wait := frozenAfter - time.Duration(past)*time.Microsecond
		if wait <= 0 {
			if s.frozen.off.Load() {
				s.frozenObserved(name, false, errors.New("sqllock: a frozen holder's transaction keeps the lease row locked; this Client cannot end it (see its earlier warning)"))
				return false
			}
			killed, err := s.endBlockers(ctx, name, holder, past)
			if err != nil {
				s.frozenRefused(ctx, name, holder, err)
				return false
			}
			if killed {
				return true
			}
			wait = frozenAfter // none idle now: look again
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return over
		}
	}
}

// endBlockers kills the connections whose idle transactions hold name's
// lease row locked, the lease, by holder, over by frozenAfter, and tells
// the log and the Observer. It reports whether it killed any.
func (s *Server) endBlockers(ctx context.Context, name, holder string, past int64) (killed bool, err error) {
	stmt := "frozen_blocker_mysql"
	if s.Forms().LockWait { // MariaDB
		stmt = "frozen_blocker_mariadb"
	}
	ids, err := s.frozenBlockers(ctx, s.Text().Named(stmt), name)
	if err != nil {
		return false, err
	}
	over := (time.Duration(past) * time.Microsecond).Round(time.Millisecond)
	// Not cut when the acquire answers, which the KILL itself lets it do
	// before the KILL's own answer comes: the log and the Observer must
	// hear of it.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CleanupTimeout)
	defer cancel()
	for _, id := range ids {
		_, err := s.cfg.DB.ExecContext(kctx, sqltext.Bind(s.cfg.Queries["frozen_kill"], strconv.FormatUint(id, 10)))
		if n, _ := fault.Errno(err); n == errNoSuchThread {
			continue
		}
		if err != nil {
			return killed, err
		}
		killed = true
		s.cfg.Log.WarnContext(ctx, "sqllock: ended a frozen holder's transaction, which kept the lease row locked after the lease had ended; its writes are rolled back",
			"name", name, "holder", holder, "connection", id, "over", over)
		s.frozenObserved(name, true,
			fmt.Errorf("sqllock: killed connection %d of holder %q: its transaction kept the lease row of %q locked %v after the lease ended", id, holder, name, over))
	}
	return killed, nil
}

// frozenBlockers returns the connections whose idle transactions hold
// name's lease row, over by frozenAfter, locked.
func (s *Server) frozenBlockers(ctx context.Context, find, name string) ([]uint64, error) {
	rows, err := s.cfg.DB.QueryContext(ctx, find, name, name, frozenAfter.Microseconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []uint64
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// The server's errors that the watch reads.
const (
	errNoSuchThread  = 1094 // KILL: "Unknown thread id": it ended meanwhile
	errKillDenied    = 1095 // KILL: another account's connection
	errNeedPrivilege = 1227 // information_schema's lock tables without PROCESS
	errTableDenied   = 1142 // performance_schema's without SELECT on it
	errUnknownView   = 1109 // a server without the lock tables
	errUnknownTable  = fault.NoSuchTable
)

// frozenRefused reports that the Client found name's lease over and its
// row locked, and cannot end the transaction that locks it, when err
// says the account or the server cannot (not a broken connection, which
// the next watch tries again): to the Observer each time, and to the log
// once per Client with what to grant; the Client then stops trying. An
// error of the caller's context (the acquire answered) is none of this.
func (s *Server) frozenRefused(ctx context.Context, name, holder string, err error) {
	n, _ := fault.Errno(err)
	if ctx.Err() != nil {
		return
	}
	mariadb := s.Forms().LockWait
	var why string
	switch {
	case n == errKillDenied && mariadb:
		why = "its connection is another account's: GRANT CONNECTION ADMIN ON *.* TO this account (or run both as one account)"
	case n == errKillDenied:
		why = "its connection is another account's: GRANT CONNECTION_ADMIN ON *.* TO this account (or run both as one account)"
	case mariadb && (n == errNeedPrivilege || n == errTableDenied):
		why = "the account cannot read information_schema's lock tables: GRANT PROCESS ON *.* TO this account"
	case n == errNeedPrivilege || n == errTableDenied:
		why = "the account cannot read performance_schema's lock tables: GRANT SELECT ON performance_schema.* TO this account"
	case n == errUnknownView || n == errUnknownTable:
		why = "this server has no such lock tables (see err)"
	default:
		return
	}
	s.frozenObserved(name, false, err)
	s.frozen.off.Store(true)
	s.frozen.warned.Do(func() {
		s.cfg.Log.WarnContext(ctx, "sqllock: cannot end a frozen holder's transaction, which keeps a lease row locked after its lease ended; "+
			"the name stays held until the server ends that transaction (wait_timeout), and this Client no longer tries: "+why,
			"name", name, "holder", holder, "err", err)
	})
}

// frozenObserved tells the Client (Config.Frozen) that an acquire of name
// met a frozen holder, ended or not, with what happened (err).
func (s *Server) frozenObserved(name string, ended bool, err error) {
	if s.cfg.Frozen != nil {
		s.cfg.Frozen(name, ended, err)
	}
}

// noFrozenEnds turns the watch off where it cannot end a frozen holder
// (Forms.EndsFrozen), and says so once, when the check chose forms.
func (s *Server) noFrozenEnds(f *Forms, version string) {
	if f.EndsFrozen() {
		return
	}
	s.frozen.warned.Do(func() {
		s.frozen.off.Store(true)
		s.cfg.Log.Info("sqllock: a holder frozen inside Lock.Check is not ended on this server (TiDB, Vitess, MySQL 5.7): "+
			"its lease row stays locked until the server ends its transaction (TiDB's tidb_idle_transaction_timeout, "+
			"vttablet's transaction timeout, wait_timeout); see docs/guarantees.md", "version", version)
	})
}

// SetFrozenLook makes the watch of a blocked acquire start after look
// instead of frozenLook: the sqlmock tests, whose one connection a watch
// would take from under their script, set it past any test's end.
func (s *Server) SetFrozenLook(look time.Duration) { s.frozen.look.Store(int64(look)) }
