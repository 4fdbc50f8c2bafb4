package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// The proofs made at a kind of lease's first use, not at the Client's: the
// statements of sets (TryAcquireSet and the like), of counting semaphores
// (Semaphore.TryAcquire and the like) and of Once. Each runs once per Client, as
// the first proof does (proof.go), on one connection, under proof names of
// its own, after the first proof has passed and the forms are chosen, and
// before the kind's first statement that writes. A Client that never takes
// a set pays nothing for proving the set statements.

// The kinds of lease proven at their first use.
const (
	proofSets = iota
	proofSlots
	proofOnce
	numLaterProofs
)

var laterProofNames = [numLaterProofs]string{proofSets: "set", proofSlots: "semaphore", proofOnce: "Once"}

// A laterProof is one of them under way: running while a call makes it,
// which other calls wait for. That it passed is in the Client's forms
// (internal/engine/forms.go).
type laterProof struct {
	mu      sync.Mutex
	running chan struct{}
}

// proveLater makes proof kind with steps unless it has passed, or waits
// for the call making it, as long as ctx allows, and then makes it itself
// if that call failed.
func (c *Client) proveLater(ctx context.Context, kind int, names func(name string) []string, steps func(p *prover, name, a, b string) error) error {
	lp := &c.later[kind]
	for {
		lp.mu.Lock()
		if c.eng.Forms().Later[kind] {
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
	err := c.proveRetrying(ctx, func(ctx context.Context) error { return c.proveLaterAttempt(ctx, names, steps) })
	if err != nil && !errors.Is(err, ErrUnsupportedServer) && !fault.IsConnectError(err) {
		err = fmt.Errorf("check the %s statements on a proof name: %w", laterProofNames[kind], err)
	}
	lp.mu.Lock()
	if err == nil {
		c.eng.Mark(func(f *engine.Forms) *bool { return &f.Later[kind] })
	}
	close(lp.running)
	lp.running = nil
	lp.mu.Unlock()
	return err
}

// proveRetrying runs attempt again, as prove does, while the connection
// under it breaks or the server rolls a step back.
func (c *Client) proveRetrying(ctx context.Context, attempt func(context.Context) error) error {
	var err error
	for n := 1; ; n++ {
		err = attempt(ctx)
		if err == nil || !proofAgain(err) || n >= fault.MaxTransientAttempts {
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
func (c *Client) proveLaterAttempt(ctx context.Context, names func(name string) []string, steps func(p *prover, name, a, b string) error) error {
	conn, name, a, b, err := c.proofConn(ctx)
	if err != nil {
		return err
	}
	p := c.newProver(ctx, conn, "")
	closeConn := func() {
		p.close()
		_ = conn.Close() // a second time returns sql.ErrConnDone
	}
	defer closeConn() // should a step panic
	err = steps(p, name, a, b)
	closeConn() // before the cleanup, which a pool of one needs
	// Under ctx while it lasts: on a loaded server the DELETE took over
	// cleanupTimeout, and a proof whose every step had passed failed.
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	for _, n := range names(name) {
		cerr := fault.RetryRolledBack(cctx, func() error {
			_, err := c.db.ExecContext(cctx, c.eng.Text().Substitute(queries["proof_clear"]), n)
			return err
		})
		if err == nil && cerr != nil {
			err = p.failed("proof_clear", "delete the proof name's rows", cerr)
		}
	}
	return err
}

// proveSetsOnce proves the set statements, once per Client, before its
// first set is taken: acquire (taken; refused with 1690 while another owner
// holds a name), refresh, check and release (each for the owner and for
// another token), release with a minimum hold, and refresh once the leases
// are gone (refused with 1690), each as text, as sets send them.
func (c *Client) proveSetsOnce(ctx context.Context) error {
	setNames := func(name string) []string { return []string{name + " 1", name + " 2"} }
	return c.proveLater(ctx, proofSets, setNames, func(p *prover, name, a, b string) error {
		names := setNames(name)
		mine, other := newLockSet(names, a), newLockSet(names, b)
		res, err := p.execText("all_acquire", "take two free names", c.acquireAllSQL(mine, proofTTL))
		if err != nil {
			return err
		}
		if c.eng.Forms().OneRow {
			if err := p.proveSetFences(mine); err != nil {
				return err
			}
		} else if id, err := res.LastInsertId(); err != nil {
			return p.failed("all_acquire", "take two free names", err)
		} else if id&1 == 0 || id < 4 {
			return p.unsupported("all_acquire", "an acquire of a set of free names reported %d, not twice its fence plus one", uint64(id))
		}
		if err := fault.RetryRolledBack(p.ctx, func() error {
			_, err := p.conn.ExecContext(p.ctx, c.acquireAllSQL(other, proofTTL))
			return err
		}); err == nil {
			return p.unsupported("all_acquire", "an acquire of a set whose names another owner held succeeded: "+
				"the BIGINT UNSIGNED overflow it relies on to refuse them raised no error (1690)")
		} else if n, ok := fault.Errno(err); !ok || n != fault.OutOfRange {
			return p.failed("all_acquire", "take a set another owner holds, which must fail with 1690", err)
		}
		us := strconv.FormatInt(proofTTL.Microseconds(), 10)
		each := func(stmt, what string, text func(s *lockSet) string) error {
			for _, step := range []struct {
				s    *lockSet
				want int64
				by   string
			}{{other, 0, "under another token"}, {mine, 2, "by the owner"}} {
				res, err := p.execText(stmt, what+" "+step.by, text(step.s))
				if err != nil {
					return err
				}
				if n, err := p.rows(stmt, what+" "+step.by, res); err != nil {
					return err
				} else if n != step.want {
					return p.unsupported(stmt, "a %s of a set of two live leases %s changed %d rows instead of %d", what, step.by, n, step.want)
				}
			}
			return nil
		}
		// A set's refresh is all or nothing: under another token it must
		// fail with 1690, as all_acquire does, and extend nothing.
		if err := p.refreshRefused(c.refreshAllSQL(other, us), "a set whose leases another owner holds",
			"the BIGINT UNSIGNED overflow it relies on to refuse it"); err != nil {
			return err
		}
		if res, err := p.execText("all_refresh", "refresh by the owner", c.refreshAllSQL(mine, us)); err != nil {
			return err
		} else if n, err := p.rows("all_refresh", "refresh by the owner", res); err != nil {
			return err
		} else if n != 2 {
			return p.unsupported("all_refresh", "a refresh of a set of two live leases by the owner changed %d rows instead of 2", n)
		}
		if err := p.inTx("all_check", func(tx *sql.Tx) error {
			for _, step := range []struct {
				s    *lockSet
				want int64
				by   string
			}{{other, 0, "under another token"}, {mine, 2, "by the owner"}} {
				res, err := tx.ExecContext(p.ctx, c.eng.Text().Set("all_check", step.s.tokenLit, step.s.in))
				if err != nil {
					return p.failed("all_check", "check "+step.by, err)
				}
				if n, err := p.rows("all_check", "check "+step.by, res); err != nil {
					return err
				} else if n != step.want {
					return p.unsupported("all_check", "a check of a set of two live leases %s changed %d rows instead of %d", step.by, n, step.want)
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := each("all_release_at_least", "release with a minimum hold", func(s *lockSet) string {
			return c.eng.Text().Set("all_release_at_least", us, s.tokenLit, s.in)
		}); err != nil {
			return err
		}
		// all_release_at_least left the leases under the token's released
		// form, which a forced release deletes them by.
		mine = newLockSet(names, releasedToken(a))
		if err := each("all_release", "release", c.releaseAllSQL); err != nil {
			return err
		}
		if c.eng.Forms().OneRow {
			return nil // a lease row is never deleted there
		}
		// The lease rows are gone, the fence rows stay: a refresh by the
		// owner must fail with 1690 too, not extend what is left of a set.
		return p.refreshRefused(c.refreshAllSQL(newLockSet(names, a), us), "a set whose lease rows were deleted",
			"the LEFT JOIN to a missing lease row")
	})
}

// refreshRefused sends all_refresh's text q, a refresh of what, and returns
// nil when it fails with 1690 (not the session guard's), as it must: an
// error naming what raised no error (cause) when it succeeds.
func (p *prover) refreshRefused(q, what, cause string) error {
	err := fault.RetryRolledBack(p.ctx, func() error {
		_, err := p.conn.ExecContext(p.ctx, q)
		return err
	})
	if err == nil {
		return p.unsupported("all_refresh", "a refresh of %s succeeded: %s raised no error (1690)", what, cause)
	}
	if n, ok := fault.Errno(err); !ok || n != fault.OutOfRange || engine.SessionGuard(err) != "" {
		return p.failed("all_refresh", "refresh "+what+", which must fail with 1690", err)
	}
	return nil
}

// proveSetFences reads back, as readFencesOneRow does, the fences of set s
// just taken with the one-row form.
func (p *prover) proveSetFences(s *lockSet) error {
	var rows *sql.Rows
	err := fault.RetryRolledBack(p.ctx, func() (err error) {
		rows, err = p.conn.QueryContext(p.ctx, p.c.eng.Text().Set("all_fences", s.tokenLit, s.in))
		return err
	})
	if err != nil {
		return p.failed("all_fences", "read the fences of a set just taken", err)
	}
	defer rows.Close()
	found := 0
	for rows.Next() {
		var name []byte
		var fence uint64
		if err := rows.Scan(&name, &fence); err != nil {
			return p.failed("all_fences", "read the fences of a set just taken", err)
		}
		if fence == 0 {
			return p.unsupported("all_fences", "a set just taken has fence 0 on %q", name)
		}
		found++
	}
	if err := rows.Err(); err != nil {
		return p.failed("all_fences", "read the fences of a set just taken", err)
	}
	if found != len(s.names) {
		return p.unsupported("all_acquire", "an acquire of a set of %d free names took %d of them", len(s.names), found)
	}
	return nil
}

// proveSlotsOnce proves the semaphore statements, once per Client, before
// its first slot is taken: slot_acquire takes the one slot of a new
// semaphore, and refuses it to another token; slot_release deletes the
// slot for its owner only. slot_acquire is prepared, as the Client
// prepares it (mariadb: with its lock wait bound).
func (c *Client) proveSlotsOnce(ctx context.Context, mariadb bool) error {
	rows := func(sem string) []string { return []string{slotRows(sem), slotName(sem, 1)} }
	return c.proveLater(ctx, proofSlots, rows, func(p *prover, name, a, b string) error {
		sem := name
		text := slotSQL(c.eng.Forms().Table, mariadb, 1)
		take := func(step, token string) (uint64, error) {
			s := &slotCall{acquireCall: acquireCall{c: c, name: slotRows(sem), ttl: proofTTL, token: token}, sem: sem, n: 1}
			id, err := p.id("slot_acquire", step, text, s.args(1)...)
			if err == nil && id == slotResized {
				id, err = p.id("slot_acquire", step+", after recording the slot count", text, s.args(1)...)
			}
			return id, err
		}
		id, err := take("take the slot of a new semaphore of one", a)
		if err != nil {
			return err
		}
		if id < slotTaken || id%128 != 1 {
			return p.unsupported("slot_acquire", "taking the free slot of a semaphore of one reported %d, not its fence times 128 plus slot 1", id)
		}
		if id, err := take("take the slot another owner holds", b); err != nil {
			return err
		} else if id != 0 {
			return p.unsupported("slot_acquire", "taking a slot of a full semaphore reported %d instead of 0 (all held)", id)
		}
		for _, step := range []struct {
			token string
			want  int64
			by    string
		}{{b, 0, "under another token"}, {a, 1, "by the owner"}} {
			var res sql.Result
			err := fault.RetryRolledBack(p.ctx, func() (err error) {
				res, err = p.conn.ExecContext(p.ctx, c.eng.Text().Substitute(queries["slot_release"]), slotRows(sem), slotRowsEnd(sem), step.token)
				return err
			})
			if err != nil {
				return p.failed("slot_release", "delete the slot "+step.by, err)
			}
			if n, err := p.rows("slot_release", "delete the slot "+step.by, res); err != nil {
				return err
			} else if n != step.want {
				return p.unsupported("slot_release", "deleting a semaphore's slots %s removed %d rows instead of %d", step.by, n, step.want)
			}
		}
		return nil
	})
}

// proveOnceOnce proves Once's statements, once per Client, before its
// first Once: once_record writes the completion record only for the
// lease's owner, and once_done finds it.
func (c *Client) proveOnceOnce(ctx context.Context) error {
	one := func(name string) []string { return []string{name} }
	return c.proveLater(ctx, proofOnce, one, func(p *prover, name, a, b string) error {
		f := c.eng.Forms()
		text := f.SQL
		us := proofTTL.Microseconds()
		args := []any{name, a, c.holder, us, name, a, c.holder, a, us}
		if f.OneRow {
			args = args[:engine.OneRowAcquireArgs]
		}
		if id, err := p.id("acquire", "take a free name", text[qAcquire], args...); err != nil {
			return err
		} else if id == 0 {
			return p.unsupported("acquire", "an acquire of a free name reported 0 (refused)")
		}
		for _, step := range []struct {
			token string
			done  bool
			by    string
		}{{b, false, "under another token"}, {a, true, "by the owner"}} {
			res, err := p.exec("once_record", "record "+step.by, text[qOnceRecord], name, step.token)
			if err != nil {
				return err
			}
			var n int64
			if c.eng.Forms().OnceByRows {
				n, err = res.RowsAffected()
			} else {
				n, err = res.LastInsertId()
			}
			if err != nil {
				return p.failed("once_record", "record "+step.by, err)
			}
			if (n != 0) != step.done {
				return p.unsupported("once_record", "a completion record %s reported %d", step.by, n)
			}
			st, err := p.stmt("once_done", text[qOnceDone])
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
// keeps ctx's values and ends once both ctx has ended and cleanupTimeout
// has passed, so that a cleanup gets ctx's time when ctx has some left, and
// cleanupTimeout of its own when it has none.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu   sync.Mutex
		stop func() bool
	)
	timer := time.AfterFunc(cleanupTimeout, func() {
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
