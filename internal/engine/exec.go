// Package engine knows the server a Client talks to: given a connection
// pool, it finds what the server is (the first-use check, tablecheck.go),
// proves that it runs the statements as MySQL does (proof.go and the files
// it names), and says the statements' text, their argument shapes and how
// to read their answers, the session guard and the refusals. It holds the
// Client's prepared statements and sends every statement through one
// entry, Exec, which makes the check and the proof first and sends the
// statement again while the server rolls it back or the connection breaks
// before the reply (fault.Send).
package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Statements of queries.sql, by index: a Send's Stmt.
const (
	Acquire = iota
	Refresh
	Release
	Inspect
	ReleaseAtLeast
	Check
	List
	OnceDone
	OnceRecord
	Lease
	OnceReset
	LockDelay
	AcquireAttached
	NumStmts
)

// Names are the statements' names in queries.sql, by index.
var Names = [NumStmts]string{
	Acquire: "acquire",
	Refresh: "refresh",
	Release: "release",
	Inspect: "inspect",

	ReleaseAtLeast: "release_at_least",
	Check:          "check",
	List:           "list",
	OnceDone:       "once_done",
	OnceRecord:     "once_record",
	Lease:          "lease",
	OnceReset:      "once_reset",
	LockDelay:      "lock_delay",

	AcquireAttached: "acquire_attached",
}

// OneRowAcquireArgs is how many of the acquire's arguments the one-row form
// (TiDB's, Vitess's) takes: the first four, which both forms begin with
// (queries.sql).
const OneRowAcquireArgs = 4

// Text marks a Send whose statement is its Text, not one of queries.sql's
// statements by index.
const Text = -1

// A Config is what a Server needs of the Client that owns it.
type Config struct {
	DB *sql.DB
	// Queries are the statements of queries.sql, by name; Table is the
	// Client's table, quoted.
	Queries sqltext.Statements
	Table   string
	// Holder is the Client's holder, which the proofs' acquires write.
	Holder string
	// NameLen and HolderLen are the widths of the name and holder columns
	// that serve at least (tablecheck.go).
	NameLen, HolderLen int
	// Classify tells what an error says (fault.Classify, with the
	// Client's own errors added).
	Classify func(error) fault.Outcome
	// Retried is told each failed send of statement stmt about name that is
	// sent again.
	Retried func(ctx context.Context, stmt, name string, err error)
	// Chosen is told the forms the first-use check chose for the server
	// that answered version, each time a check chooses (tablecheck.go).
	Chosen func(f *Forms, version string)
	// Log is told what the first use could not prove (pool.go), and of the
	// frozen holders ended, or not (frozen.go).
	Log *slog.Logger
	// Frozen is told that an acquire of name met a frozen holder (frozen.go)
	// and ended its transaction, or could not, with what happened (err).
	Frozen func(name string, ended bool, err error)
	// Errorf makes an error as the Client's own read (errors.go); Errors
	// are the Client's errors that the Server's wrap.
	Errorf func(format string, args ...any) error
	Errors Errors
	// Token returns a fresh owner token; Released, the owner a release with
	// a minimum hold leaves on a lease of token (queries.sql).
	Token    func() (string, error)
	Released func(token string) string
	// Closed is the error a statement gets once Close has closed the
	// statements.
	Closed error
	// Budget bounds the resends (fault.Budget: the library's when zero).
	Budget fault.Budget
	// CleanupTimeout is what a cleanup after a proof gets of its own
	// (cleanupContext).
	CleanupTimeout time.Duration
}

// Errors are the Client's errors that the Server's errors wrap.
type Errors struct {
	// Unsupported: the server does not run the statements as MySQL does.
	// BadTable: the table differs from schema.sql. ReadOnly: the server
	// refuses writes. AutocommitOff: the session has autocommit off.
	Unsupported, BadTable, ReadOnly, AutocommitOff error
}

// A Server holds a Client's prepared statements until Close. Its zero value
// is not usable: New makes one.
type Server struct {
	cfg   Config
	forms atomic.Pointer[Forms] // forms.go
	fixed [NumStmts]atomic.Pointer[sql.Stmt]

	// mu guards the fields below it. It is never held across a call to the
	// server: a call stuck on a dead connection must not hold up others,
	// which wait only as long as their own contexts allow.
	mu      sync.Mutex
	flights map[any]*flight      // prepares under way, by statement index or text
	byText  map[string]*sql.Stmt // statements prepared by their text (slot_acquire's)
	closed  bool                 // the statements are closed; no more are prepared

	recheck   tableRecheck         // the table checked again while the Client runs; tablecheck.go
	later     [NumLater]laterProof // the proofs of sets, slots and Once; later.go
	poolProof poolProof            // what the first use left to prove for want of a spare connection; pool.go
	frozen    frozenState          // ending a frozen holder's transaction; frozen.go
	// clustered: the proof found a node of a cluster whose every node may
	// take writes (facts.go), where the Client keeps no session (Sessions).
	clustered atomic.Bool
	attached  attachedSeen // names an acquire found attached; attached.go
}

// New returns a Server with cfg that has prepared nothing.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg}
	s.forms.Store(initialForms(cfg.Queries, cfg.Table))
	return s
}

// A Send is one statement to send.
type Send struct {
	// Stmt is the statement of queries.sql, by index, prepared once; or
	// Text, for a statement sent as Text.
	Stmt int
	// Text is the statement, when Stmt is Text; Label names it for logs and
	// the Observer, and Name is the lease name or set label it is about.
	Text, Label, Name string
	// Prepared: Text is prepared once, not sent as text (slot_acquire, one
	// text for each number of slot rows).
	Prepared bool
	// Until, when set, ends the resends of a rolled-back statement sooner:
	// a refresh's end when the lease could.
	Until time.Time
	Args  []any
}

// Exec sends s, again while the server rolls it back (deadlock, lock wait
// timeout, cluster conflict) or the connection breaks before the reply;
// each resend is told to Config.Retried. The arguments carry the caller's
// token, so a resend gives the answer the first send would have. unknown
// counts the sends whose outcome is unknown: each of them may have
// committed, or may still. A statement that takes or extends a lease first
// has the table checked again when due (tableStillGood).
func (s *Server) Exec(ctx context.Context, x Send) (res sql.Result, unknown int, err error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err // nothing sent, nothing to clean up
	}
	var (
		st      *sql.Stmt
		label   = x.Label
		name    = x.Name
		acquire bool
		guarded bool
		args    = x.Args
	)
	switch {
	case x.Stmt != Text:
		if st, err = s.Stmt(ctx, x.Stmt); err != nil {
			return nil, 0, err
		}
		label, acquire = Names[x.Stmt], x.Stmt == Acquire || x.Stmt == AcquireAttached
		guarded = acquire || x.Stmt == Refresh
		if acquire && s.Forms().OneRow {
			args = args[:OneRowAcquireArgs]
		}
		name, _ = args[0].(string) // most statements start with the name
		switch x.Stmt {
		case Refresh, ReleaseAtLeast:
			name, _ = args[1].(string)
		case LockDelay:
			name, _ = args[3].(string)
		}
	case x.Prepared:
		if st, err = s.textStmt(ctx, x.Text); err != nil {
			return nil, 0, err
		}
		acquire, guarded = true, true
	default:
		acquire = strings.HasPrefix(label, "all_acquire")
		guarded = acquire || label == "all_refresh" || label == "renew_many" ||
			label == "session_open" || label == "session_renew" || label == "session_attach"
	}
	if guarded && !s.recheckQuiet(0) {
		if err := s.tableStillGood(ctx); err != nil {
			return nil, 0, err
		}
	}
	return fault.Send(ctx, fault.Sending{
		Until:    x.Until,
		Budget:   s.cfg.Budget,
		Acquire:  acquire,
		Classify: s.cfg.Classify,
		Retried:  func(err error) { s.cfg.Retried(ctx, label, name, err) },
		Closed:   s.closedErr,
	}, func() (sql.Result, error) {
		if st == nil {
			return s.cfg.DB.ExecContext(ctx, x.Text, args...)
		}
		res, err := st.ExecContext(ctx, args...)
		if err != nil && x.Prepared && s.Closed() {
			// "sql: statement is closed": Close closed it (Send ends on
			// Closed at once).
			return nil, s.cfg.Closed
		}
		return res, err
	})
}

// A flight is one prepare of a statement under way. Every caller that
// needs the statement waits for it, each as long as its own context
// allows; st and err are set when done is closed.
type flight struct {
	done chan struct{}
	st   *sql.Stmt
	err  error
}

// Stmt returns statement i, preparing it on first use, after the first-use
// check and, for a statement that writes, the proof (ready).
// Callers that need a statement another caller is preparing wait for that
// prepare, as long as ctx allows; if the preparing caller's context ends
// first, a waiter prepares it anew.
func (s *Server) Stmt(ctx context.Context, i int) (*sql.Stmt, error) {
	if st := s.fixed[i].Load(); st != nil {
		return st, nil
	}
	return s.cached(ctx, i, func() (*sql.Stmt, error) {
		if err := s.ready(ctx, Writes(i)); err != nil {
			return nil, err
		}
		st, err := s.prepare(ctx, s.Forms().SQL[i])
		if err != nil && !fault.IsConnectError(err) {
			return nil, fmt.Errorf("prepare: %w", err)
		}
		return st, err
	})
}

// textStmt returns the statement of text, preparing it on first use.
func (s *Server) textStmt(ctx context.Context, text string) (*sql.Stmt, error) {
	return s.cached(ctx, text, func() (*sql.Stmt, error) { return s.prepare(ctx, text) })
}

// prepare prepares text, again while the connection breaks or the server
// rolls the prepare back.
func (s *Server) prepare(ctx context.Context, text string) (st *sql.Stmt, err error) {
	err = fault.Transient(ctx, func() (err error) {
		st, err = s.cfg.DB.PrepareContext(ctx, text)
		return err
	})
	return st, err
}

// cached returns the statement of key (an index or a text), once prepared by
// prep, with one prepare under way at a time.
func (s *Server) cached(ctx context.Context, key any, prep func() (*sql.Stmt, error)) (*sql.Stmt, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, s.cfg.Closed
		}
		if st := s.load(key); st != nil {
			s.mu.Unlock()
			return st, nil
		}
		f := s.flights[key]
		lead := f == nil
		if lead {
			f = &flight{done: make(chan struct{})}
			if s.flights == nil {
				s.flights = make(map[any]*flight)
			}
			s.flights[key] = f
		}
		s.mu.Unlock()
		if lead {
			s.land(key, f, prep)
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.err != nil && !lead && isContextErr(f.err) {
			continue // the preparing caller gave up; ours is still live
		}
		return f.st, f.err
	}
}

// load returns the statement of key prepared so far; s.mu is held.
func (s *Server) load(key any) *sql.Stmt {
	if i, ok := key.(int); ok {
		return s.fixed[i].Load()
	}
	return s.byText[key.(string)]
}

// land runs the prepare flight f of key and publishes its result.
func (s *Server) land(key any, f *flight, prep func() (*sql.Stmt, error)) {
	st, err := prep()
	s.mu.Lock()
	delete(s.flights, key)
	closed := s.closed
	if err == nil && !closed {
		if i, ok := key.(int); ok {
			s.fixed[i].Store(st)
		} else {
			if s.byText == nil {
				s.byText = make(map[string]*sql.Stmt)
			}
			s.byText[key.(string)] = st
		}
	}
	s.mu.Unlock()
	if err == nil && closed {
		// Close finished while this prepare ran: nobody else will close it.
		_ = st.Close()
		st, err = nil, s.cfg.Closed
	}
	f.st, f.err = st, err
	close(f.done)
}

// Prepared returns statement i as prepared so far, or nil.
func (s *Server) Prepared(i int) *sql.Stmt { return s.fixed[i].Load() }

// Close closes the statements; a prepare that ends from now on closes its
// statement. database/sql makes closing a statement wait for the executions
// of it under way, and one may hang on a dead connection until its context
// ends: so each statement is closed on a goroutine of its own, and Close
// waits for them only until ctx ends. (Closing a prepared *sql.Stmt reports
// no error.)
func (s *Server) Close(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	stmts := make([]*sql.Stmt, 0, NumStmts+len(s.byText))
	for i := range s.fixed {
		if st := s.fixed[i].Swap(nil); st != nil {
			stmts = append(stmts, st)
		}
	}
	for _, st := range s.byText {
		stmts = append(stmts, st)
	}
	s.byText = nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, st := range stmts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = st.Close()
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Closed reports whether Close has closed the statements.
func (s *Server) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// closedErr is Config.Closed once Close has closed the statements, else nil.
func (s *Server) closedErr() error {
	if s.Closed() {
		return s.cfg.Closed
	}
	return nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Acquire sends the acquire of name with args (Exec), under a watch for a
// frozen holder; on MariaDB, a send that stopped waiting for
// its row behind a lease that has ended is sent again at once, a few times
// (frozenResends), so that a transaction waits for the row when its
// blocker is due to be ended.
func (s *Server) Acquire(ctx context.Context, name string, args ...any) (res sql.Result, unknown int, err error) {
	// The statement prepared first: the first use finds the server, which
	// says whether to watch.
	if _, err := s.Stmt(ctx, Acquire); err != nil {
		return nil, 0, err
	}
	stmt := Acquire
	if s.attached.has(name) {
		stmt = AcquireAttached // found attached last time (attached.go)
	}
	for resends := 0; ; resends++ {
		w := s.watchFrozen(ctx, name)
		r, u, err := s.Exec(ctx, Send{Stmt: stmt, Args: args})
		unknown += u
		if err == nil && stmt == Acquire && attachedMark(r) {
			// The lease is attached to its holder's session, which
			// acquire does not read: acquire_attached decides. acquire
			// wrote nothing.
			w.stop()
			s.attached.add(name)
			stmt, resends = AcquireAttached, -1
			continue
		}
		if err == nil && stmt == AcquireAttached && takenMark(r) {
			s.attached.drop(name)
		}
		if !w.stop() || resends == frozenResends {
			return r, unknown, err
		}
		if n, ok := fault.Errno(err); !ok || n != fault.LockWaitTimeout {
			return r, unknown, err
		}
	}
}

// watchFrozen starts the watch of a send of an acquire of name, under
// ctx; nil (which stop accepts) where the Client does not watch: TiDB and
// Vitess (one-row forms), MySQL 5.7, and before the first use has found
// the server.
func (s *Server) watchFrozen(ctx context.Context, name string) *frozenWatch {
	if f := s.Forms(); !f.Chosen || !f.EndsFrozen() {
		return nil
	}
	w := &frozenWatch{s: s, name: name, parent: ctx}
	w.wg.Add(1)
	look := frozenLook
	if l := time.Duration(s.frozen.look.Load()); l != 0 {
		look = l
	}
	w.timer = time.AfterFunc(look, w.run)
	return w
}

// stop ends the watch, waiting for it if it has started, and reports
// whether the send, if its row stayed locked past its bound, is worth
// sending again at once: the watch ended the row's blocker, or found the
// lease over and its row still locked, which the next wait can end.
func (w *frozenWatch) stop() (resend bool) {
	if w == nil || w.timer.Stop() {
		return false
	}
	w.mu.Lock()
	w.stopped = true
	if w.cancel != nil {
		w.cancel()
	}
	w.mu.Unlock()
	w.wg.Wait()
	return w.resend
}

// Ahead is what a caller about to wait on a wake-up channel calls first
// (wait.Config.Ahead): the table's check, when it comes due within half its
// period, so that a wake-up within that half finds it fresh, and the
// acquire follows it at once, not after the check's round trip. A
// difference found now is the acquire's answer (its statement's guard).
func (s *Server) Ahead(ctx context.Context) {
	if !s.recheckQuiet(TableRecheckEvery / 2) {
		_ = s.TableCheckAhead(ctx, TableRecheckEvery/2)
	}
}
