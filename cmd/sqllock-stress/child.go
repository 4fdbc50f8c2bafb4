package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sqllock/sqllock"
)

// A worker is one child process: goroutines that contend for the names
// until stop, and report each critical section as a JSON line.
type worker struct {
	cfg   config
	c     *sqllock.Client
	clock *sql.Stmt // the server's now, and this holder's lease expiry
	write *sql.Stmt // the fenced write to the protected resource
	stop  time.Time

	mu     sync.Mutex // guards out and report
	out    *json.Encoder
	report childReport
}

// runChild is the child process: cfg.child is its number.
func runChild(ctx context.Context, cfg config, stdout io.Writer) error {
	db, resDB, err := openDBs(cfg.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	defer resDB.Close()
	c, err := sqllock.New(db, sqllock.WithTable(cfg.table), sqllock.WithHolder(fmt.Sprintf("sqllock-stress:%d", cfg.child)))
	if err != nil {
		return err
	}
	defer c.Close()
	w := &worker{cfg: cfg, c: c, stop: time.UnixMilli(cfg.stopAt), out: json.NewEncoder(stdout)}
	// The lease row is read as schema.sql defines it, guarded by the owner
	// token, so only this holder's own lease answers.
	w.clock, err = db.PrepareContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), "+
		"(SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) FROM `"+cfg.table+"` WHERE name = ? AND kind = 'L' AND owner = ?)")
	if err != nil {
		return err
	}
	defer w.clock.Close()
	// The resource accepts a write only with a fence at least the highest
	// it accepted (a holder's later writes carry its fence again; fences
	// are unique to holders), decided in the statement itself. writes
	// always changes, so affected rows is 1 exactly when accepted.
	w.write, err = resDB.PrepareContext(ctx, "UPDATE `"+resourceTable(cfg.table)+"` SET fence = ?, writes = writes + 1 WHERE name = ? AND fence <= ?")
	if err != nil {
		return err
	}
	defer w.write.Close()

	var wg sync.WaitGroup
	for g := range cfg.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.contend(ctx, g)
		}()
	}
	wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.report.Done = true
	return w.out.Encode(w.report)
}

func (w *worker) count(f func(r *childReport)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.report)
}

func (w *worker) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.count(func(r *childReport) {
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
// critical section; on refusal pause briefly and try again.
func (w *worker) contend(ctx context.Context, g int) {
	ttl := w.cfg.ttl
	for time.Now().Before(w.stop) {
		name := nameOf(rand.N(w.cfg.names))
		w.count(func(r *childReport) { r.Attempts++ })
		l, err := w.c.TryAcquire(ctx, name, ttl)
		switch {
		case errors.Is(err, sqllock.ErrNotAcquired):
			w.count(func(r *childReport) { r.Refused++ })
			if w.cfg.broken {
				w.intrude(ctx, g, name)
			}
			time.Sleep(rand.N(ttl/20 + time.Millisecond))
			continue
		case err != nil:
			w.fail("p%d/g%d: TryAcquire(%q): %v", w.cfg.child, g, name, err)
			time.Sleep(ttl / 10)
			continue
		}
		rec, err := w.section(ctx, g, l)
		if err != nil {
			w.fail("p%d/g%d: %q: %v", w.cfg.child, g, name, err)
			continue
		}
		w.emit(rec)
	}
}

// serverClock returns the server's now and, when the lease on name is
// still token's, its expiry (µs since 1970).
func (w *worker) serverClock(ctx context.Context, name, token string) (now int64, expiry sql.NullInt64, err error) {
	err = w.clock.QueryRowContext(ctx, name, token).Scan(&now, &expiry)
	return now, expiry, err
}

// protectedWrite writes to the resource with fence and reports whether the
// resource accepted it.
func (w *worker) protectedWrite(ctx context.Context, name string, fence uint64) (bool, error) {
	res, err := w.write.ExecContext(ctx, fence, name, fence)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// section is one critical section under l: read the server's clock and the
// lease's expiry, write, either stall past the lease or refresh it, write
// again, read the clock, release.
func (w *worker) section(ctx context.Context, g int, l *sqllock.Lock) (record, error) {
	ttl := w.cfg.ttl
	rec := record{Proc: w.cfg.child, Goroutine: g, Name: l.Name(), Fence: l.Fence(), Stalled: rand.Float64() < w.cfg.stallFraction}
	now, expiry, err := w.serverClock(ctx, l.Name(), l.Token())
	received := time.Now()
	if err != nil {
		return rec, err
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
		ok, err := w.protectedWrite(ctx, l.Name(), l.Fence())
		if ok {
			rec.Accepted++
		} else {
			rec.Rejected++
		}
		return err
	}
	if err := writes(); err != nil {
		return rec, err
	}
	if rec.Stalled {
		time.Sleep(ttl + ttl/2) // past the lease, without refreshing
	} else {
		time.Sleep(rand.N(ttl/4 + 1))
		w.count(func(r *childReport) { r.Refresh++ })
		if err := l.Refresh(ctx, ttl); err != nil && !errors.Is(err, sqllock.ErrNotHeld) {
			return rec, err
		}
	}
	if err := writes(); err != nil {
		return rec, err
	}
	now, expiry, err = w.serverClock(ctx, l.Name(), l.Token())
	if err != nil {
		return rec, err
	}
	rec.End = now
	if expiry.Valid {
		rec.Expiry = max(rec.Expiry, expiry.Int64)
	}
	switch err := l.Release(ctx); {
	case errors.Is(err, sqllock.ErrNotHeld):
		rec.TakenOver = true
	case err != nil:
		return rec, err
	}
	return rec, nil
}

// intrude is the broken holder of -selftest-broken: refused, it works on the
// name anyway, claiming the fence the name has now and a full lease, as a
// lock that let two holders in would. The checker must catch it.
func (w *worker) intrude(ctx context.Context, g int, name string) {
	info, err := w.c.Inspect(ctx, name)
	if err != nil || !info.Held {
		return
	}
	now, _, err := w.serverClock(ctx, name, "")
	if err != nil {
		return
	}
	rec := record{Proc: w.cfg.child, Goroutine: g, Name: name, Fence: info.Fence, Start: now, Expiry: now + w.cfg.ttl.Microseconds()}
	time.Sleep(w.cfg.ttl / 4)
	if rec.End, _, err = w.serverClock(ctx, name, ""); err == nil {
		w.emit(rec)
	}
}
