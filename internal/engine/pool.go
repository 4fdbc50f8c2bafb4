package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// The part of the first proof that needs more than one connection of the
// pool at once (facts.go: every connection reaches one server, the
// row lock between two of them) takes the connections beyond its first
// only when the pool has them to spare: a caller may hold the rest, in a
// transaction begun before the lock was taken, and would wait on the
// Client while the Client waited on it. Where the pool has none to spare
// (all in use, or a limit of one), the Client says in one log line what was
// not proven, and the first acquire after that finds two connections free
// proves it (ProvePending). Until then, leases rest on it unproven (a
// balancer over two primaries would go unseen); once a later proof has
// refused the pool, every acquire is refused until one passes.

// A poolProof is what the first proof left for a later acquire to prove.
type poolProof struct {
	pending atomic.Pointer[pendingProof] // nil: nothing is left
	running sync.Mutex                   // one later proof at a time; other calls go on without it
}

// A pendingProof is the proof left to a later acquire: what the first
// proof's connection answered, against which the later one holds the
// others.
type pendingProof struct {
	version string
	first   serverFacts
	plain   bool  // as readFacts's
	refused error // the last later proof's refusal, which every acquire returns until one passes
}

const (
	// minSpareWait and maxSpareWait bound how long the proof waits for a
	// connection the pool had free when it looked but another goroutine
	// took first; spareWaitRTTs round trips of the proof's first
	// connection, between the two.
	minSpareWait  = 200 * time.Millisecond
	maxSpareWait  = 2 * time.Second
	spareWaitRTTs = 50
)

// spareWait is how long the proof waits for a connection the pool had
// free, for a server whose round trip took rtt.
func spareWait(rtt time.Duration) time.Duration {
	return min(max(spareWaitRTTs*rtt, minSpareWait), maxSpareWait)
}

// spareConn returns a connection of the pool unless every one the pool may
// open is in use: then nil, at once. A pool without a limit opens one.
// Between the look and the take another goroutine may take the last free
// one: the take waits for it at most wait, then returns nil too.
func (s *Server) spareConn(ctx context.Context, wait time.Duration) (*sql.Conn, error) {
	st := s.cfg.DB.Stats()
	switch {
	case st.MaxOpenConnections <= 0:
		return s.cfg.DB.Conn(ctx) // database/sql never waits for a pool without a limit
	case st.InUse >= st.MaxOpenConnections:
		return nil, nil
	}
	return s.connWithin(ctx, wait)
}

// connWithin returns a connection of the pool if one comes within wait,
// else nil; ctx's end is an error.
func (s *Server) connWithin(ctx context.Context, wait time.Duration) (*sql.Conn, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := s.cfg.DB.Conn(wctx)
	if err != nil && wctx.Err() != nil && fault.CtxErr(ctx) == nil {
		return nil, nil
	}
	return conn, err
}

// deferPoolProof notes that the first proof, on a server that answered
// version and first, could not prove what needs a second connection, and
// says so in one log line per Client.
func (s *Server) deferPoolProof(version string, first serverFacts, plain bool) {
	if !s.poolProof.pending.CompareAndSwap(nil, &pendingProof{version: version, first: first, plain: plain}) {
		return
	}
	const what = "the row lock between two connections, and that every connection reaches one server"
	if st := s.cfg.DB.Stats(); st.MaxOpenConnections == 1 {
		s.cfg.Log.Info("sqllock: first use could not prove "+what+": the pool's limit is one connection (SetMaxOpenConns(1)); "+
			"an acquire proves them once the limit allows two", "not_proven", what, "max_open_connections", 1)
	} else {
		s.cfg.Log.Info("sqllock: first use could not prove "+what+": the pool had no second connection free; "+
			"the first acquire that finds two free proves them", "not_proven", what,
			"in_use", st.InUse, "max_open_connections", st.MaxOpenConnections)
	}
}

// PoolProofPending reports whether the first proof left a part to prove
// for want of a spare connection, not proven since.
func (s *Server) PoolProofPending() bool { return s.poolProof.pending.Load() != nil }

// errNoSpare means the pool had no connection to spare for a later proof.
var errNoSpare = errors.New("sqllock: no connection of the pool to spare")

// ProvePending makes the proof the first one left, if any, when the pool
// has two connections free, and returns its refusal, or the last one's when
// none can be made now. Nothing else a later proof meets (a broken
// connection, ctx's end) is the call's error: the next acquire tries again.
// It costs an atomic load when nothing is left, and a look at the pool's
// counts while something is.
func (s *Server) ProvePending(ctx context.Context) error {
	p := s.poolProof.pending.Load()
	if p == nil {
		return nil
	}
	if st := s.cfg.DB.Stats(); st.MaxOpenConnections > 0 && st.MaxOpenConnections-st.InUse < 2 {
		return p.refused
	}
	if !s.poolProof.running.TryLock() {
		return p.refused // another call is making it
	}
	defer s.poolProof.running.Unlock()
	if p = s.poolProof.pending.Load(); p == nil {
		return nil
	}
	err := s.provePoolAttempt(ctx, p)
	switch {
	case err == nil:
		s.poolProof.pending.Store(nil)
		s.cfg.Log.Debug("sqllock: proved what the first use could not: the row lock between two connections, and one server behind them")
		return nil
	case errors.Is(err, s.cfg.Errors.Unsupported), errors.Is(err, s.cfg.Errors.ReadOnly):
		next := *p
		next.refused = err
		s.poolProof.pending.Store(&next)
		return err
	}
	return p.refused
}

// provePoolAttempt takes two connections the pool has to spare, holds each
// to the first proof's server (p), and proves the row lock between them
// under a proof name of its own, whose rows it deletes whatever happens.
func (s *Server) provePoolAttempt(ctx context.Context, p *pendingProof) error {
	name, a, b, err := s.proofName()
	if err != nil {
		return err
	}
	var conns []*sql.Conn
	closeConns := func() {
		for _, conn := range conns {
			_ = conn.Close() // a second time returns sql.ErrConnDone
		}
	}
	defer closeConns()
	wait := spareWait(p.first.rtt)
	plain := p.plain
	var rtt time.Duration
	for len(conns) < 2 {
		conn, err := s.spareConn(ctx, wait)
		if err != nil {
			return err
		}
		if conn == nil {
			return errNoSpare
		}
		conns = append(conns, conn)
		start := time.Now()
		if err := s.sameServer(ctx, conn, p.version, p.first, &plain); err != nil {
			return err
		}
		rtt = time.Since(start)
	}
	text := s.Forms().SQL
	_, err = s.proveConcurrency(ctx, conns[0], conns[1], rtt, &text, p.version, name, a, b)
	closeConns() // before the cleanup, which a small pool needs
	cctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	if cerr := fault.RetryRolledBack(cctx, func() error {
		_, err := s.cfg.DB.ExecContext(cctx, s.Text().Substitute(s.cfg.Queries["proof_clear"]), name)
		return err
	}); err == nil && cerr != nil {
		err = fmt.Errorf("delete the proof name's rows: %w", cerr)
	}
	return err
}
