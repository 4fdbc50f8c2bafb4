package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
)

// A worker is one child process: goroutines that contend for the names
// until stop, and report each critical section as a JSON line.
type worker struct {
	cfg   config
	nodes []*node // one per DSN, in the order given
	stop  time.Time

	mu     sync.Mutex // guards out and report
	out    *json.Encoder
	report childReport
}

// A node is what a worker holds for one DSN: a Client, and the statements
// that read the server's clock and write the protected resource, prepared
// on first use (a node may be down when the run starts).
type node struct {
	cfg   config
	db    *sql.DB
	resDB *sql.DB
	c     *sqllock.Client

	mu    sync.Mutex
	clock *sql.Stmt // the server's now, and this holder's lease expiry
	write *sql.Stmt // the fenced write to the protected resource
}

func openNode(cfg config, dsn string) (*node, error) {
	db, resDB, err := openDBs(dsn)
	if err != nil {
		return nil, err
	}
	// Wake-up channels are on by default; only -wakeups's Acquire uses them.
	c, err := sqllock.New(db, sqllock.WithTable(cfg.table), sqllock.WithHolder(holderOf(cfg.child)))
	if err != nil {
		db.Close()
		resDB.Close()
		return nil, err
	}
	return &node{cfg: cfg, db: db, resDB: resDB, c: c}, nil
}

// holderOf is the holder text of child i's Clients.
func holderOf(i int) string { return fmt.Sprintf("sqllock-stress:%d", i) }

func (n *node) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, st := range []*sql.Stmt{n.clock, n.write} {
		if st != nil {
			st.Close()
		}
	}
	n.c.Close()
	n.db.Close()
	n.resDB.Close()
}

// stmts returns the node's statements, preparing them the first time.
func (n *node) stmts(ctx context.Context) (clock, write *sql.Stmt, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.clock == nil {
		// The lease row is read as schema.sql defines it, guarded by the
		// owner token, so only this holder's own lease answers. A lease
		// attached to its holder's session (expires_at 9999) ends with
		// the session's row (queries.sql, the top): its end is that row's,
		// or none with no row. TiDB's and Vitess's Clients attach no lease
		// (their one-row forms), and vtgate cannot evaluate that reading
		// on a sharded keyspace (1235): there the row's expiry is read as
		// it is.
		var version string
		if err := n.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
			return nil, nil, err
		}
		t := "`" + n.cfg.table + "`"
		end := "IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at)"
		join := " LEFT JOIN " + t + " AS s ON l.expires_at = '9999-12-31 23:59:59.999999' AND s.name = LEFT(l.owner, 16) AND s.kind = 'S'"
		if strings.Contains(version, "Vitess") || strings.Contains(version, "TiDB") {
			end, join = "l.expires_at", ""
		}
		st, err := n.db.PrepareContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), "+
			"(SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', "+end+") FROM "+t+" AS l"+join+
			" WHERE l.name = ? AND l.kind = 'L' AND l.owner = ?)")
		if err != nil {
			return nil, nil, err
		}
		n.clock = st
	}
	if n.write == nil {
		// The resource accepts a write only with a fence at least the
		// highest it accepted (a holder's later writes carry its fence
		// again; fences are unique to holders), decided in the statement
		// itself. writes always changes, so affected rows is 1 exactly
		// when accepted.
		st, err := n.resDB.PrepareContext(ctx, "UPDATE `"+resourceTable(n.cfg.table)+"` SET fence = ?, writes = writes + 1 WHERE name = ? AND fence <= ?")
		if err != nil {
			return nil, nil, err
		}
		n.write = st
	}
	return n.clock, n.write, nil
}

// runChild is the child process: cfg.child is its number. Once set up it
// says so on stdout ({"ready":true}) and reads from stdin when the run
// ends (unix ms), which the parent sends once every child is ready.
func runChild(ctx context.Context, cfg config, stdin io.Reader, stdout io.Writer) error {
	if cfg.cutChannels > 0 {
		// The parent kills connections on purpose: the driver's log of
		// each would drown the report.
		_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	}
	w := &worker{cfg: cfg, out: json.NewEncoder(stdout), report: childReport{Classes: map[string]int{}}}
	for _, dsn := range cfg.dsns {
		n, err := openNode(cfg, dsn)
		if err != nil {
			return err
		}
		defer n.close()
		w.nodes = append(w.nodes, n)
	}
	w.warmUp(ctx)
	if err := w.out.Encode(struct {
		Ready bool `json:"ready"`
	}{true}); err != nil {
		return err
	}
	var stopAt int64
	if _, err := fmt.Fscan(stdin, &stopAt); err != nil {
		return fmt.Errorf("read the run's end from the parent: %w", err)
	}
	w.stop = time.UnixMilli(stopAt)
	var wg sync.WaitGroup
	for g := range cfg.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if cfg.set > 0 {
				w.contendSet(ctx, g)
				return
			}
			w.contend(ctx, g)
		}()
	}
	wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.report.Done = true
	return w.out.Encode(w.report)
}

// warmUp takes and releases a name of the child's own on the node it
// starts on, so that its Client's first use (the proof: a few round trips,
// and waits of up to half a second each) is over before the run starts; on
// a loaded machine it took seconds of a short run. A failure is left to the
// run, which meets the same server.
func (w *worker) warmUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	n := w.nodes[w.cfg.child%len(w.nodes)]
	if l, err := n.c.TryAcquire(ctx, fmt.Sprintf("warm-up-%d", w.cfg.child), time.Second); err == nil {
		_ = l.Release(ctx)
	}
}

func (w *worker) count(f func(r *childReport)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.report)
}

// fail counts an error of operation op by its class, and keeps the first
// few in full.
func (w *worker) fail(op string, err error, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.count(func(r *childReport) {
		r.Classes[op+": "+errClass(err)]++
		if len(r.Errors) < 20 {
			r.Errors = append(r.Errors, msg)
		}
	})
}

func (w *worker) emit(rec record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.out.Encode(rec); err != nil {
		w.report.Errors = append(w.report.Errors, err.Error())
	}
}

// contend is one goroutine: try a random name, and on success run a
// critical section; on refusal pause briefly and try again. It starts on
// the node its process is given (processes are spread over the DSNs) and
// moves to the next DSN when its node cannot serve: down, read-only, or
// out of the cluster.
func (w *worker) contend(ctx context.Context, g int) {
	ttl := w.cfg.ttl
	cur := w.cfg.child % len(w.nodes)
	next := func(err error) {
		if movesOn(err) {
			cur = (cur + 1) % len(w.nodes)
		}
	}
	for time.Now().Before(w.stop) {
		n := w.nodes[cur]
		name := nameOf(rand.N(w.cfg.names))
		w.count(func(r *childReport) { r.Attempts++ })
		call := stamp()
		l, err := w.acquire(ctx, n, name)
		acq := histOp{Kind: "acquire", Name: name, Goroutine: g, Result: opResult(err, "refused"), Call: call, Return: stamp(),
			TTL: int64(ttl), KeepAlive: w.cfg.keepAlive}
		if err == nil {
			acq.Fence = l.Fence()
		}
		w.hist(acq)
		switch {
		case errors.Is(err, sqllock.ErrNotAcquired):
			w.count(func(r *childReport) { r.Refused++ })
			if w.cfg.broken {
				w.intrude(ctx, n, g, name)
			}
			time.Sleep(rand.N(ttl/20 + time.Millisecond))
			continue
		case err != nil:
			w.fail("acquire", err, "p%d/g%d: TryAcquire(%q): %v", w.cfg.child, g, name, err)
			next(err)
			time.Sleep(ttl / 10)
			continue
		}
		rec, op, err := w.section(ctx, n, g, l)
		if err != nil {
			// The section is reported and checked all the same: what it
			// did before the error counts.
			rec.Err = op + ": " + errClass(err)
			w.fail(op, err, "p%d/g%d: %q: %s: %v", w.cfg.child, g, name, op, err)
			next(err)
		}
		w.emit(rec)
	}
}

// opTimeout bounds each operation of a section, so that a node that stops
// answering without closing its connections cannot hold a worker past the
// end of the run for long.
const opTimeout = 30 * time.Second

// acquire takes name on n with TryAcquire, or with -wakeups with Acquire,
// which waits on the name's wake-up channel, for a few leases at most.
func (w *worker) acquire(ctx context.Context, n *node, name string) (*sqllock.Lock, error) {
	if !w.cfg.wakeups {
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		return n.c.TryAcquire(ctx, name, w.cfg.ttl)
	}
	ctx, cancel := context.WithDeadline(ctx, minTime(w.stop, time.Now().Add(5*w.cfg.ttl)))
	defer cancel()
	return n.c.Acquire(ctx, name, w.cfg.ttl)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// serverClock returns the server's now and, when the lease on name is
// still token's, its expiry (µs since 1970).
func (n *node) serverClock(ctx context.Context, name, token string) (now int64, expiry sql.NullInt64, err error) {
	clock, _, err := n.stmts(ctx)
	if err != nil {
		return 0, expiry, err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	err = clock.QueryRowContext(ctx, name, token).Scan(&now, &expiry)
	return now, expiry, err
}

// protectedWrite writes to the resource with fence and reports whether the
// resource accepted it. A write the server rolls back for a conflict is
// sent again, a few times, as an application would: on a multi-writer
// cluster the node may not have applied the previous holder's write yet,
// and certification refuses the later one. conflicts counts those.
func (n *node) protectedWrite(ctx context.Context, l *sqllock.Lock) (ok bool, conflicts int, err error) {
	return n.fencedWrite(ctx, l.Name(), l.Fence())
}

// fencedWrite is protectedWrite of name with fence.
func (n *node) fencedWrite(ctx context.Context, name string, fence uint64) (ok bool, conflicts int, err error) {
	_, write, err := n.stmts(ctx)
	if err != nil {
		return false, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	for {
		res, err := write.ExecContext(ctx, fence, name, fence)
		if err != nil {
			if conflict(err) && conflicts < maxWriteConflicts {
				conflicts++
				time.Sleep(time.Millisecond + rand.N(time.Duration(conflicts)*2*time.Millisecond))
				continue
			}
			return false, conflicts, err
		}
		c, err := res.RowsAffected()
		return c == 1, conflicts, err
	}
}

// checkedWrite is -check's protected write: in one transaction, Lock.Check,
// then an unguarded write of l's fence to the register, which counts the
// writes that take it back. It reports whether the write committed; a
// Check that finds the lease lost refuses it. Conflicts are sent again as
// in protectedWrite. An error may leave the outcome unknown.
func (n *node) checkedWrite(ctx context.Context, l *sqllock.Lock) (ok bool, conflicts int, err error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	for {
		ok, err := n.checkedWriteOnce(ctx, l)
		if err != nil && conflict(err) && conflicts < maxWriteConflicts {
			conflicts++
			time.Sleep(time.Millisecond + rand.N(time.Duration(conflicts)*2*time.Millisecond))
			continue
		}
		return ok, conflicts, err
	}
}

func (n *node) checkedWriteOnce(ctx context.Context, l *sqllock.Lock) (ok bool, err error) {
	tx, err := n.resDB.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // after a commit, a no-op
	if !n.cfg.skipCheck {
		if err := l.Check(ctx, tx); errors.Is(err, sqllock.ErrNotHeld) {
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	// back is assigned first: MySQL assigns left to right, and MariaDB
	// does too unless SIMULTANEOUS_ASSIGNMENT, which reads the old row.
	if _, err := tx.ExecContext(ctx, "UPDATE `"+resourceTable(n.cfg.table)+"` SET back = back + (fence > ?), fence = ?, writes = writes + 1 WHERE name = ?",
		l.Fence(), l.Fence(), l.Name()); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	return true, nil
}

// maxWriteConflicts bounds how often protectedWrite sends a write again.
const maxWriteConflicts = 10

// section is one critical section under l: read the server's clock and the
// lease's expiry, write, either stall past the lease or refresh it, write
// again, read the clock, release. On an error it returns what it recorded
// so far and the operation that failed.
func (w *worker) section(ctx context.Context, n *node, g int, l *sqllock.Lock) (rec record, op string, err error) {
	ttl := w.cfg.ttl
	rec = record{Proc: w.cfg.child, Goroutine: g, Name: l.Name(), Fence: l.Fence(), Stalled: rand.Float64() < w.cfg.stallFraction,
		Belief: l.ValidUntil().UnixMicro(), Acquired: time.Now().UnixMicro()}
	defer func() {
		if err != nil {
			// A section cut short ends all the same; a release that
			// cannot reach the server leaves the lease to expire.
			rec.Released = time.Now().UnixMicro()
			w.release(ctx, g, l)
		}
	}()
	now, expiry, err := n.serverClock(ctx, l.Name(), l.Token())
	received := time.Now()
	if err != nil {
		return rec, "clock", err
	}
	rec.Start = now
	if expiry.Valid {
		rec.Expiry = expiry.Int64
	} else {
		// The row is not ours any more: take the holder's belief, mapped
		// onto the server's clock no later than it can be (the server read
		// its clock before the reply was received).
		rec.Expiry = now + l.ValidUntil().Sub(received).Microseconds()
	}
	writes := func() error {
		write := n.protectedWrite
		if w.cfg.checked {
			write = n.checkedWrite
		}
		call := stamp()
		ok, conflicts, err := write(ctx, l)
		w.histWrite(g, l.Name(), l.Fence(), 0, call, ok, err)
		rec.Conflicts += conflicts
		switch {
		case ok:
			rec.Accepted++
		case err == nil:
			rec.Rejected++
		case conflict(err):
			// rolled back: not applied
		default:
			rec.Maybe++ // the write may or may not have been applied
		}
		return err
	}
	if err := writes(); err != nil {
		return rec, "write", err
	}
	var kctx context.Context
	switch {
	case w.cfg.keepAlive:
		// The keep-alive renews the lease through the sleep, a stalled
		// holder's too; only a fault can make it lose the lease.
		kctx = l.KeepAlive(ctx)
		if rec.Stalled {
			time.Sleep(ttl + ttl/2)
		} else {
			time.Sleep(rand.N(ttl/2 + 1))
		}
	case rec.Stalled:
		time.Sleep(ttl + ttl/2) // past the lease, without refreshing
	default:
		time.Sleep(rand.N(ttl/4 + 1))
		w.count(func(r *childReport) { r.Refresh++ })
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		call := stamp()
		err := l.Refresh(rctx, ttl)
		cancel()
		w.hist(histOp{Kind: "refresh", Name: l.Name(), Goroutine: g, Fence: l.Fence(), Result: opResult(err, "notheld"),
			Call: call, Return: stamp(), TTL: int64(ttl)})
		if err != nil && !errors.Is(err, sqllock.ErrNotHeld) {
			return rec, "refresh", err
		}
		if err == nil {
			rec.Belief = max(rec.Belief, l.ValidUntil().UnixMicro())
		}
	}
	if err := writes(); err != nil {
		return rec, "write", err
	}
	now, expiry, err = n.serverClock(ctx, l.Name(), l.Token())
	if err != nil {
		return rec, "clock", err
	}
	rec.End = now
	if expiry.Valid {
		rec.Expiry = max(rec.Expiry, expiry.Int64)
	}
	if kctx != nil {
		// A keep-alive that has not reported a loss by now claims the
		// lease: the belief check holds it to that.
		if rec.KeepAliveLost = kctx.Err() != nil; !rec.KeepAliveLost {
			rec.Belief = max(rec.Belief, time.Now().UnixMicro())
		}
	}
	switch err := w.release(ctx, g, l); {
	case errors.Is(err, sqllock.ErrNotHeld):
		rec.TakenOver = true
	case err != nil:
		return rec, "release", err
	}
	return rec, "", nil
}

// release releases l, within opTimeout, and records it in the history:
// once for each name of a set.
func (w *worker) release(ctx context.Context, g int, l *sqllock.Lock) error {
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	call := stamp()
	err := l.Release(rctx)
	ret := stamp()
	names, fences := l.Names(), l.Fences()
	set := 0
	if len(names) > 1 {
		set = len(names)
	}
	for i, name := range names {
		w.hist(histOp{Kind: "release", Name: name, Goroutine: g, Fence: fences[i], Result: opResult(err, "notheld"),
			Call: call, Return: ret, Set: set})
	}
	return err
}

// histWrite records a protected write of name with fence in the history:
// a fenced write, or with -check a write after Lock.Check; set is the
// size of the set it belongs to (0: a single name).
func (w *worker) histWrite(g int, name string, fence uint64, set int, call int64, ok bool, err error) {
	op := histOp{Kind: "write", Name: name, Goroutine: g, Fence: fence, Call: call, Return: stamp(), Set: set}
	refused := "rejected"
	if w.cfg.checked {
		op.Kind, refused = "cwrite", "refused"
	}
	switch {
	case ok:
		op.Result = "ok"
	case err == nil:
		op.Result = refused
	case conflict(err):
		op.Result = "none" // rolled back: not applied
	default:
		op.Result = "unknown"
	}
	w.hist(op)
}

// intrude is the broken holder of -selftest-broken: refused, it works on the
// name anyway, claiming the fence the name has now and a full lease, as a
// lock that let two holders in would. The checker must catch it.
func (w *worker) intrude(ctx context.Context, n *node, g int, name string) {
	info, err := n.c.Inspect(ctx, name)
	if err != nil || !info.Held {
		return
	}
	now, _, err := n.serverClock(ctx, name, "")
	if err != nil {
		return
	}
	rec := record{Proc: w.cfg.child, Goroutine: g, Name: name, Fence: info.Fence, Start: now, Expiry: now + w.cfg.ttl.Microseconds()}
	time.Sleep(w.cfg.ttl / 4)
	if rec.End, _, err = n.serverClock(ctx, name, ""); err == nil {
		w.emit(rec)
	}
}
