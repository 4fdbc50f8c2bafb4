package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// The proofs made at a kind of lease's first use, not at the Client's: the
// statements of sets (TryAcquireSet and the like), of counting semaphores
// (Semaphore.TryAcquire and the like), of Once, and of the sessions that
// keep many leases alive (before a Client's first session). Each runs once
// per Client, as the first proof does (proof.go), on one connection, under
// proof names of its own, after the first proof has passed and the forms
// are chosen, and before the kind's first statement that writes. A Client that never takes
// a set pays nothing for proving the set statements.

// The kinds of lease proven at their first use.
const (
	LaterSets = iota
	LaterSlots
	LaterOnce
	LaterSessions
)

// LaterNames name the kinds proven at their first use, by kind.
var LaterNames = [NumLater]string{LaterSets: "set", LaterSlots: "semaphore", LaterOnce: "Once", LaterSessions: "session"}

// A laterProof is one of them under way: running while a call makes it,
// which other calls wait for. That it passed is in the Client's forms
// (forms.go).
type laterProof struct {
	mu      sync.Mutex
	running chan struct{}
}

// proveLater makes proof kind with steps unless it has passed, or waits
// for the call making it, as long as ctx allows, and then makes it itself
// if that call failed.
func (s *Server) proveLater(ctx context.Context, kind int, names func(name string) []string, steps func(p *prover, name, a, b string) error) error {
	lp := &s.later[kind]
	for {
		lp.mu.Lock()
		if s.Forms().Later[kind] {
			lp.mu.Unlock()
			return nil
		}
		running := lp.running
		if running == nil {
			lp.running = make(chan struct{})
			lp.mu.Unlock()
			break
		}
		lp.mu.Unlock()
		select {
		case <-running:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := s.proveRetrying(ctx, func(ctx context.Context) error { return s.proveLaterAttempt(ctx, names, steps) })
	if err != nil && !errors.Is(err, s.cfg.Errors.Unsupported) && !fault.IsConnectError(err) {
		err = fmt.Errorf("check the %s statements on a proof name: %w", LaterNames[kind], err)
	}
	lp.mu.Lock()
	if err == nil {
		s.Mark(func(f *Forms) *bool { return &f.Later[kind] })
	}
	close(lp.running)
	lp.running = nil
	lp.mu.Unlock()
	return err
}

// proveRetrying runs attempt again, as prove does, while the connection
// under it breaks or the server rolls a step back.
func (s *Server) proveRetrying(ctx context.Context, attempt func(context.Context) error) error {
	var err error
	for n := 1; ; n++ {
		err = attempt(ctx)
		if err == nil || !s.proofAgain(err) || n >= fault.MaxTransientAttempts {
			return err
		}
		if werr := fault.Sleep(ctx, fault.Backoff(n)); werr != nil {
			return fmt.Errorf("%w (last error: %w)", werr, err)
		}
	}
}

// proveLaterAttempt makes one attempt at a proof on one connection, under
// a proof name with two tokens of its own, and deletes every row of the
// names the proof used (names of the proof name), whatever the outcome.
func (s *Server) proveLaterAttempt(ctx context.Context, names func(name string) []string, steps func(p *prover, name, a, b string) error) error {
	conn, name, a, b, err := s.proofConn(ctx)
	if err != nil {
		return err
	}
	p := s.newProver(ctx, conn, "")
	closeConn := func() {
		p.close()
		_ = conn.Close() // a second time returns sql.ErrConnDone
	}
	defer closeConn() // should a step panic
	err = steps(p, name, a, b)
	closeConn() // before the cleanup, which a pool of one needs
	// Under ctx while it lasts: on a loaded server the DELETE took over
	// Config.CleanupTimeout, and a proof whose every step had passed failed.
	cctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	for _, n := range names(name) {
		cerr := fault.RetryRolledBack(cctx, func() error {
			_, err := s.cfg.DB.ExecContext(cctx, s.Text().Substitute(s.cfg.Queries["proof_clear"]), n)
			return err
		})
		if err == nil && cerr != nil {
			err = p.failed("proof_clear", "delete the proof name's rows", cerr)
		}
	}
	return err
}

// ProveOnceRecords proves Once's statements, once per Client, before its
// first Once: once_record writes the completion record only for the
// lease's owner, and once_done finds it.
func (s *Server) ProveOnceRecords(ctx context.Context) error {
	one := func(name string) []string { return []string{name} }
	return s.proveLater(ctx, LaterOnce, one, func(p *prover, name, a, b string) error {
		f := s.Forms()
		text := f.SQL
		if id, err := p.id("acquire", "take a free name", text[Acquire], s.acquireArgs(name, a, proofTTL.Microseconds())...); err != nil {
			return err
		} else if id == 0 {
			return p.unsupported("acquire", "an acquire of a free name reported 0 (refused)")
		}
		for _, step := range []struct {
			token string
			done  bool
			by    string
		}{{b, false, "under another token"}, {a, true, "by the owner"}} {
			res, err := p.exec("once_record", "record "+step.by, text[OnceRecord], name, step.token)
			if err != nil {
				return err
			}
			n, err := f.OnceRecorded(res)
			if err != nil {
				return p.failed("once_record", "record "+step.by, err)
			}
			if (n != 0) != step.done {
				return p.unsupported("once_record", "a completion record %s reported %d", step.by, n)
			}
			st, err := p.stmt("once_done", text[OnceDone])
			if err != nil {
				return err
			}
			var one int
			err = fault.RetryRolledBack(p.ctx, func() error { return st.QueryRowContext(p.ctx, name).Scan(&one) })
			if found := err == nil; err != nil && err != sql.ErrNoRows {
				return p.failed("once_done", "read the record after a record "+step.by, err)
			} else if found != step.done {
				return p.unsupported("once_done", "after a completion record %s, the record was found: %v", step.by, found)
			}
		}
		return nil
	})
}

// cleanupContext returns the context of a cleanup after work under ctx: it
// keeps ctx's values and ends once both ctx has ended and Config.CleanupTimeout
// has passed, so that a cleanup gets ctx's time when ctx has some left, and
// Config.CleanupTimeout of its own when it has none.
func (s *Server) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu   sync.Mutex
		stop func() bool
	)
	timer := time.AfterFunc(s.cfg.CleanupTimeout, func() {
		mu.Lock()
		defer mu.Unlock()
		stop = context.AfterFunc(ctx, cancel) // at once if ctx has ended
	})
	return cctx, func() {
		timer.Stop()
		mu.Lock()
		if stop != nil {
			stop()
		}
		mu.Unlock()
		cancel()
	}
}
