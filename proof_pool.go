package sqllock

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
// pool at once (proof_server.go: every connection reaches one server, the
// row lock between two of them) takes the connections beyond its first
// only when the pool has them to spare: a caller may hold the rest, in a
// transaction begun before the lock was taken, and would wait on the
// Client while the Client waited on it. Where the pool has none to spare
// (all in use, or a limit of one), the Client says in one log line what was
// not proven, and the first acquire after that finds two connections free
// proves it (provePending). Until then, leases rest on it unproven (a
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
func (c *Client) spareConn(ctx context.Context, wait time.Duration) (*sql.Conn, error) {
	s := c.db.Stats()
	switch {
	case s.MaxOpenConnections <= 0:
		return c.db.Conn(ctx) // database/sql never waits for a pool without a limit
	case s.InUse >= s.MaxOpenConnections:
		return nil, nil
	}
	return c.connWithin(ctx, wait)
}

// connWithin returns a connection of the pool if one comes within wait,
// else nil; ctx's end is an error.
func (c *Client) connWithin(ctx context.Context, wait time.Duration) (*sql.Conn, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := c.db.Conn(wctx)
	if err != nil && wctx.Err() != nil && ctxErr(ctx) == nil {
		return nil, nil
	}
	return conn, err
}

// deferPoolProof notes that the first proof, on a server that answered
// version and first, could not prove what needs a second connection, and
// says so in one log line per Client.
func (c *Client) deferPoolProof(version string, first serverFacts, plain bool) {
	if !c.poolProof.pending.CompareAndSwap(nil, &pendingProof{version: version, first: first, plain: plain}) {
		return
	}
	const what = "the row lock between two connections, and that every connection reaches one server"
	if s := c.db.Stats(); s.MaxOpenConnections == 1 {
		c.log.Info("sqllock: first use could not prove "+what+": the pool's limit is one connection (SetMaxOpenConns(1)); "+
			"an acquire proves them once the limit allows two", "not_proven", what, "max_open_connections", 1)
	} else {
		c.log.Info("sqllock: first use could not prove "+what+": the pool had no second connection free; "+
			"the first acquire that finds two free proves them", "not_proven", what,
			"in_use", s.InUse, "max_open_connections", s.MaxOpenConnections)
	}
}

// errNoSpare means the pool had no connection to spare for a later proof.
var errNoSpare = errors.New("sqllock: no connection of the pool to spare")

// provePending makes the proof the first one left, if any, when the pool
// has two connections free, and returns its refusal, or the last one's when
// none can be made now. Nothing else a later proof meets (a broken
// connection, ctx's end) is the call's error: the next acquire tries again.
// It costs an atomic load when nothing is left, and a look at the pool's
// counts while something is.
func (c *Client) provePending(ctx context.Context) error {
	p := c.poolProof.pending.Load()
	if p == nil {
		return nil
	}
	if s := c.db.Stats(); s.MaxOpenConnections > 0 && s.MaxOpenConnections-s.InUse < 2 {
		return p.refused
	}
	if !c.poolProof.running.TryLock() {
		return p.refused // another call is making it
	}
	defer c.poolProof.running.Unlock()
	if p = c.poolProof.pending.Load(); p == nil {
		return nil
	}
	err := c.provePoolAttempt(ctx, p)
	switch {
	case err == nil:
		c.poolProof.pending.Store(nil)
		c.log.Debug("sqllock: proved what the first use could not: the row lock between two connections, and one server behind them")
		return nil
	case errors.Is(err, ErrUnsupportedServer), errors.Is(err, errReadOnlyServer):
		next := *p
		next.refused = err
		c.poolProof.pending.Store(&next)
		return err
	}
	return p.refused
}

// provePoolAttempt takes two connections the pool has to spare, holds each
// to the first proof's server (p), and proves the row lock between them
// under a proof name of its own, whose rows it deletes whatever happens.
func (c *Client) provePoolAttempt(ctx context.Context, p *pendingProof) error {
	name, a, b, err := proofName()
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
		conn, err := c.spareConn(ctx, wait)
		if err != nil {
			return err
		}
		if conn == nil {
			return errNoSpare
		}
		conns = append(conns, conn)
		start := time.Now()
		if err := c.sameServer(ctx, conn, p.version, p.first, &plain); err != nil {
			return err
		}
		rtt = time.Since(start)
	}
	text := c.eng.Forms().SQL
	_, err = c.proveConcurrency(ctx, conns[0], conns[1], rtt, &text, p.version, name, a, b)
	closeConns() // before the cleanup, which a small pool needs
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if cerr := fault.RetryRolledBack(cctx, func() error {
		_, err := c.db.ExecContext(cctx, c.eng.Text().Substitute(queries["proof_clear"]), name)
		return err
	}); err == nil && cerr != nil {
		err = fmt.Errorf("delete the proof name's rows: %w", cerr)
	}
	return err
}

// poolFull returns, for the error of a call that ended with its context,
// a note that every connection the pool may open was in use, as when the
// caller holds the last in a transaction: the call may have waited for one
// all along. "" otherwise.
func (c *Client) poolFull() string {
	s := c.db.Stats()
	if s.MaxOpenConnections <= 0 || s.InUse < s.MaxOpenConnections {
		return ""
	}
	return fmt.Sprintf(" (every connection of the pool was in use, at its limit SetMaxOpenConns(%d): the call may have waited for one the caller holds, in a transaction?)", s.MaxOpenConnections)
}
