//go:build unix

package sqllock

// A leader stopped (SIGSTOP) inside its Lock.Check transaction, measured:
// the child process and its stop are pause_test.go's.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock/observe"
)

// frozenTTL is the lease of the frozen leader test: its stop, three times
// as long, outlasts the goal for a new leader, ttl + 2 s.
const frozenTTL = 2 * time.Second

// A leader (Elect) that stops inside a Lock.Check transaction, its lease
// row locked, for three times its ttl, is replaced within the stop, and
// the write it makes in that transaction when it continues is refused:
// another candidate's acquire ended the transaction. In each of several
// rounds (SQLLOCK_PAUSE_ROUNDS, 2 by default; docs/guarantees.md gives
// 20, which also hold each round to the goal of a new leader within
// ttl + 2 s of the stop).
func TestClient_Elect_leaderFrozenInCheck(t *testing.T) {
	rounds := pauseRounds(t, 2)
	byHand := os.Getenv("SQLLOCK_PAUSE_ROUNDS") != ""
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessFrozenEnds(t, e)
		table := e.newTable(t)
		createResource(t, e, table)
		child := startPauseChild(t, e, table, "check-lead", frozenTTL)
		rec, logOpt := newRecorder()
		var evs frozenEvents
		other := e.client(t, e.db, table, WithHolder("other"), logOpt, evs.option())
		r := &resource{db: e.db, table: table + "_res", who: "other"}
		var fence uint64
		var worst time.Duration
		for round := 1; round <= rounds; round++ {
			var took time.Duration
			fence, took = leaderFrozen(t, child, other, r, fence)
			worst = max(worst, took)
			if byHand && took > frozenTTL+2*time.Second {
				t.Errorf("round %d: a new leader %v after the stop, want within ttl + 2 s (%v)", round, took, frozenTTL+2*time.Second)
			}
			t.Logf("round %d: a new leader %v after the leader stopped in its Check transaction (ttl %v)", round, took.Round(time.Millisecond), frozenTTL)
		}
		if got := evs.count(observe.OutcomeRolledBack); got < rounds {
			t.Errorf("frozen_holder events, rolled_back: got %d, want at least %d", got, rounds)
		}
		warns := rec.find(slog.LevelWarn, "ended a frozen holder's transaction", "leader")
		if len(warns) < rounds || attr(warns[0], "holder") != "paused-child" {
			t.Errorf("Warns: got %d (%q), want at least %d naming holder paused-child", len(warns), rec.atLeast(slog.LevelWarn), rounds)
		}
		t.Logf("%s: %d rounds, ttl %v, each stopped for %v inside Check: a new leader at most %v after the stop; every frozen write refused at its resume",
			e.server.Label, rounds, frozenTTL, 3*frozenTTL, worst.Round(time.Millisecond))
		_ = child.stdin.Close()
		child.waitExit(t, 20*time.Second)
	})
}

// leaderFrozen makes one round of TestClient_Elect_leaderFrozenInCheck: it
// waits for the child to lead with a fresh lease whose fence is above
// after, stops it inside its next Check transaction, lets other lead (and
// write to r) while the child stays stopped for three times its ttl,
// continues it and checks that its write was refused, then ends other's
// lead. It returns the stopped lead's fence and how long after the stop
// other began to lead.
func leaderFrozen(t *testing.T, child *pauseChild, other *Client, r *resource, after uint64) (uint64, time.Duration) {
	t.Helper()
	fence, losses := child.fresh(t, after)
	stopped := time.Now() // the signal's; the stop comes a unit later
	child.signal(t, syscall.SIGUSR1)
	child.waitStopped(t)

	ctx, cancel := context.WithCancel(testCtx(t))
	var (
		mu    sync.Mutex
		ledAt time.Time
	)
	elected := make(chan error, 1)
	go func() {
		elected <- other.Elect(ctx, "leader", frozenTTL, Callbacks{OnStartedLeading: func(ctx context.Context, l *Lock) error {
			mu.Lock()
			ledAt = time.Now()
			mu.Unlock()
			if _, err := r.write(ctx, l.Fence()); err != nil && ctx.Err() == nil {
				return err
			}
			<-ctx.Done()
			return nil
		}})
	}()
	time.Sleep(time.Until(stopped.Add(3 * frozenTTL)))
	resumed := time.Now()
	child.signal(t, syscall.SIGCONT)
	var frozen pauseUnit
	waitFor(t, 20*time.Second, "the stopped leader's write", func() bool {
		units, _, _ := child.snapshot()
		for _, u := range units {
			if u.fence == fence && u.wrote.After(resumed) {
				frozen = u
				return true
			}
		}
		return false
	})
	child.waitLost(t, losses)
	cancel()
	if err := <-elected; !errors.Is(err, context.Canceled) {
		t.Fatalf("the other candidate's Elect: got %v, want context.Canceled", err)
	}
	if frozen.write == "ok" {
		t.Errorf("the write the leader made in its Check transaction when it continued: got %q, want it refused", frozen.write)
	}
	mu.Lock()
	defer mu.Unlock()
	if ledAt.IsZero() || ledAt.After(resumed) {
		t.Fatalf("another leader during the stop: got none (at %v), want one", ledAt)
	}
	return fence, ledAt.Sub(stopped)
}

// frozenChildLead is TestPauseChild's role "check-lead": it leads name
// "leader" under Elect, each unit of its work a transaction that Checks
// the lease and writes the resource with the fence, and prints each unit
// as pauseWork does. On SIGUSR1 it stops itself inside its next
// transaction, after the Check.
func frozenChildLead(ctx context.Context, t *testing.T, c *Client, db *sql.DB, ttl time.Duration) {
	stopNext := stopOnUSR1()
	r := &resource{db: db, table: os.Getenv(pauseTableEnv) + "_res", who: "child"}
	err := c.Elect(ctx, "leader", ttl, Callbacks{OnStartedLeading: func(lctx context.Context, l *Lock) error {
		for lctx.Err() == nil {
			check, left := time.Now(), time.Until(l.ValidUntil())
			// Under ctx, not the lease's: only the server stops the write.
			result := r.checkedWrite(ctx, l, stopNext)
			fmt.Printf("pause unit %d %d %d %s %d\n", check.UnixNano(), l.Fence(), left.Milliseconds(), result, time.Now().UnixNano())
			time.Sleep(5 * time.Millisecond)
		}
		cause := context.Cause(lctx)
		fmt.Printf("pause lost %d %t %v\n", time.Now().UnixNano(), errors.Is(cause, ErrLockLost), cause)
		return nil
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Elect: %v", err)
	}
}

// checkedWrite writes the next value with l's fence in a transaction that
// Checks l first, and stops the process after the Check when stop is set.
// It returns "ok", "refused" (by the fence), "unchecked" (Check refused)
// or "failed" (the transaction failed: its connection was ended).
func (r *resource) checkedWrite(ctx context.Context, l *Lock, stop *atomic.Bool) string {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return "failed"
	}
	defer tx.Rollback()
	if err := l.Check(ctx, tx); err != nil {
		if errors.Is(err, ErrNotHeld) {
			return "unchecked"
		}
		return "failed"
	}
	if stop.Swap(false) {
		stopSelf()
	}
	r.n++
	res, err := tx.ExecContext(ctx, "UPDATE `"+r.table+"` SET v = ?, fence = ? WHERE id = 1 AND fence <= ?",
		fmt.Sprintf("%s-%d", r.who, r.n), l.Fence(), l.Fence())
	if err != nil {
		return "failed"
	}
	n, err := res.RowsAffected()
	if err != nil || tx.Commit() != nil {
		return "failed"
	}
	if n != 1 {
		return "refused"
	}
	return "ok"
}
