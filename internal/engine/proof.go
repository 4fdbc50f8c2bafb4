package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// A server that calls itself MySQL may not behave like it: every decision
// sqllock makes rests on the insert id of the OK packet of the statement
// that made it (queries.sql), so a layer that hands back another number (one
// read afterwards with SELECT LAST_INSERT_ID(), perhaps on another pooled
// connection, or the first of two values a statement set) gives two owners
// one name. So before the first statement that writes, a Client proves, on
// one connection of its pool, what the statements rely on, with its own
// table, statements and DSN, under a proof name nobody else uses, each
// statement sent as the Client sends it (prover.go):
//
//  0. the version, as the connection answers a query on no table: a layer
//     answers that itself (Vitess says 8.4.6-Vitess), though it passes the
//     first-use check's query on the table to the server behind it;
//     then proveServer (facts.go): a writable server, one server
//     behind the pool's connections, the row lock between two of them, and
//     the semantics of proof_go;
//  1. acquire under token A: the insert id is a fence (above the marks 1 and
//     2 the statement sets first), and it is the fence the table holds;
//  2. refresh under token B, which matches no row and so sets no insert id:
//     0, not the value step 1 left in the session;
//  3. acquire under token B: 0, refused, while A's lease is live;
//  4. acquire under token A again: the same fence, as a retry after a lost
//     reply must give;
//  5. refresh under token A: extended;
//  6. check, in a transaction as Lock.Check sends it: no row under B, the
//     lease row under A;
//  7. release_at_least under B: not ours; under A: ours;
//  8. release under B: no row; under A: the row was A's;
//
// then it deletes the proof name's rows. The proof costs fifteen
// statements (about 24 round trips with the default DSN: five prepares,
// and check's own each time) and a few commits, once per Client
// (BenchmarkFirstUse; docs/servers.md has the figures). The statements of
// sets, semaphores and Once are proven at their own first use
// (later.go). A failed proof is made again by the next statement that
// writes. A server that refuses writes (read-only, a failover) fails the
// proof with its own error, which the callers that wait for a failover
// treat as they treat it from an acquire; reads (Inspect, List) need no
// proof.

// ready makes the first-use check (tablecheck.go), until it has found the
// table as it should be, and, when writes, the proof, before a statement
// is first prepared.
func (s *Server) ready(ctx context.Context, writes bool) error {
	checked := s.Forms().Checked
	if !checked {
		found, err := s.checkFirstUse(ctx)
		if err != nil {
			return err
		}
		if found {
			s.Mark(func(f *Forms) *bool { return &f.Checked })
		}
		checked = found
	}
	if checked && writes {
		return s.proveOnce(ctx)
	}
	return nil
}

// FirstUse makes the first-use check and the proof, unless they have
// passed: CreateTable's, after it created the table.
func (s *Server) FirstUse(ctx context.Context) error { return s.ready(ctx, true) }

// proofTTL is the proof lease's length: long enough that it cannot expire
// between its steps, short enough that one left behind by a proof cut off
// midway soon frees nothing anyone waits for (its name is the proof's own).
const proofTTL = time.Minute

// ProofPrefix begins every proof name: a zero byte, which no name a person
// writes begins with, then the proof's own random token.
const ProofPrefix = "\x00sqllock proof "

// vitessRefusal says why a Client refuses Vitess with the two-row forms.
const vitessRefusal = "vtgate puts its own session's last insert id in place of every LAST_INSERT_ID() without an argument, " +
	"so the two-row acquire, which reads there the mark its first row set, decides on another value, " +
	"and two clients could both be told they hold one name"

// refuseByVersion returns an error wrapping s.cfg.Errors.Unsupported for a
// server known by its version string to run the statements unsafely: Vitess,
// unless the first-use check chose the one-row forms, which read no
// LAST_INSERT_ID() (tablecheck.go) and which the proof then holds to their
// answers.
func (s *Server) refuseByVersion(version string) error {
	if strings.Contains(strings.ToLower(version), "vitess") && !s.Forms().OneRow {
		return s.cfg.Errorf("%w: Vitess (%s): %s; no lease was taken", s.cfg.Errors.Unsupported, version, vitessRefusal)
	}
	return nil
}

// Writes reports whether statement i writes, and so needs the proof first.
func Writes(i int) bool {
	switch i {
	case Inspect, List, OnceDone, Lease:
		return false
	}
	return true
}

// proveOnce makes the proof unless it has passed already.
func (s *Server) proveOnce(ctx context.Context) error {
	if s.Forms().Proven {
		return nil
	}
	if err := s.prove(ctx); err != nil {
		return err
	}
	s.Mark(func(f *Forms) *bool { return &f.Proven })
	return nil
}

// prove makes the proof above. A connection that breaks under it (a lost
// reply, a killed connection) is no answer, and a step the server rolled
// back (a deadlock with another Client's proof, a cluster conflict) past
// its own retries proves nothing either: the proof is made again on
// another connection, under a fresh name, up to fault.MaxTransientAttempts
// times, as exec sends a statement again.
func (s *Server) prove(ctx context.Context) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = s.proveAttempt(ctx)
		if err == nil || !s.proofAgain(err) || attempt >= fault.MaxTransientAttempts {
			break
		}
		if werr := fault.Sleep(ctx, fault.Backoff(attempt)); werr != nil {
			err = fmt.Errorf("%w (last error: %w)", werr, err)
			break
		}
	}
	if err == nil || errors.Is(err, s.cfg.Errors.Unsupported) || errors.Is(err, s.cfg.Errors.ReadOnly) || fault.IsConnectError(err) {
		return err // serverError names the step
	}
	return fmt.Errorf("check the statements on a proof name: %w", err)
}

// proofAgain reports whether the proof failed for want of an answer, and is
// made again: its connection broke, or the server rolled a step back.
func (s *Server) proofAgain(err error) bool {
	switch s.cfg.Classify(err) {
	case fault.Unknown, fault.RolledBack:
		return true
	}
	return errors.Is(err, sql.ErrConnDone)
}

// proofName returns a proof name and two tokens of their own, for one
// attempt at a proof.
func (s *Server) proofName() (name, a, b string, err error) {
	if a, err = s.cfg.Token(); err != nil {
		return "", "", "", fmt.Errorf("sqllock: token: %w", err)
	}
	if b, err = s.cfg.Token(); err != nil {
		return "", "", "", fmt.Errorf("sqllock: token: %w", err)
	}
	return ProofPrefix + a, a, b, nil
}

// proofConn returns a connection of the pool for one attempt at a proof,
// with a proof name and two tokens of the attempt's own; the caller closes
// the connection.
func (s *Server) proofConn(ctx context.Context) (conn *sql.Conn, name, a, b string, err error) {
	if name, a, b, err = s.proofName(); err != nil {
		return nil, "", "", "", err
	}
	if conn, err = s.cfg.DB.Conn(ctx); err != nil {
		return nil, "", "", "", err
	}
	return conn, name, a, b, nil
}

// proveAttempt makes one attempt at the proof on one connection, under a name
// of its own, and deletes what it left there, with a context of its own.
func (s *Server) proveAttempt(ctx context.Context) error {
	conn, name, a, b, err := s.proofConn(ctx)
	if err != nil {
		return err
	}
	text := s.Forms().SQL // TiDB's forms, if the first-use check chose them
	err = s.proveOn(ctx, conn, &text, name, a, b)
	_ = conn.Close() // before the cleanup, which a pool of one needs
	if err != nil && !s.isRefusal(err) {
		// The proof name is ours alone: whatever the proof left there
		// goes, on any connection, whatever ctx has become.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CleanupTimeout)
		defer cancel()
		_ = fault.RetryRolledBack(cctx, func() error {
			_, err := s.cfg.DB.ExecContext(cctx, s.Text().Substitute(s.cfg.Queries["proof_clear"]), name)
			return err
		})
	}
	return err
}

// isRefusal reports whether err says the server refused the statement
// outright, having run nothing.
func (s *Server) isRefusal(err error) bool { return s.cfg.Classify(err) == fault.Refused }

// proveOn runs the proof's steps on conn: first the version as the
// connection itself answers it, on no table (the first-use check's
// VERSION() sits in a query on the table, which a sharding layer such as
// Vitess passes on to the server behind it), then the statements.
func (s *Server) proveOn(ctx context.Context, conn *sql.Conn, text *[NumStmts]string, name, a, b string) error {
	var version string
	if err := fault.RetryRolledBack(ctx, func() error {
		return conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	}); err != nil {
		return err
	}
	if err := s.refuseByVersion(version); err != nil {
		return err
	}
	var plain bool
	first, err := s.checkWritable(ctx, conn, version, &plain) // facts.go
	if err != nil {
		return err
	}
	if err := s.proveStatements(ctx, conn, text, version, name, a, b); err != nil {
		return err
	}
	return s.proveServer(ctx, conn, text, version, first, &plain, name, a, b)
}
