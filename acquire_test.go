package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MariaDB's snapshot isolation (innodb_snapshot_isolation, ON by default from
// 11.6) under SERIALIZABLE refuses an acquire whose lease row another
// transaction changed while the acquire waited for it: Error 1020, "Record
// has changed since last read". The statement was rolled back, so the
// acquire is sent again with its token and takes the lease.
func TestClient_TryAcquire_recordChanged_retried(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if !e.server.MariaDB {
			t.Skip("innodb_snapshot_isolation is MariaDB's")
		}
		var on int
		if err := e.db.QueryRow("SELECT @@innodb_snapshot_isolation").Scan(&on); err != nil {
			t.Skipf("this MariaDB has no innodb_snapshot_isolation (10.6.18, 10.11.8 and later do): %v", err)
		}
		table := e.newTable(t)
		db := e.openDBWith(t, func(c *mysql.Config) {
			setParam(c, "innodb_snapshot_isolation", "ON")
			setParam(c, "tx_isolation", "'SERIALIZABLE'")
		})
		db.SetMaxOpenConns(1)
		c := e.client(t, db, table, WithHolder("serializable"))
		witness := e.client(t, e.openDB(t), table, WithHolder("witness"))
		// An expired lease for the acquire to take over; the statements are
		// prepared first, so that the acquire's one connection is known.
		mustAcquire(t, witness, "job", time.Millisecond)
		mustAcquire(t, c, "warm", time.Minute)
		var id int64
		if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
			t.Fatal(err)
		}

		// Another transaction locks the lease row and changes it while the
		// acquire waits for it.
		k := &killEnv{admin: e.openDB(t)}
		ctx := testCtx(t)
		tx, err := k.admin.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "UPDATE `"+table+"` SET expires_at = expires_at - INTERVAL 1 SECOND WHERE name = 'job' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			l, err := c.TryAcquire(ctx, "job", time.Minute)
			if err == nil && l.Fence() == 0 {
				err = errors.New("no fence")
			}
			done <- err
		}()
		k.waitRunning(t, id)
		time.Sleep(50 * time.Millisecond) // waiting for the row lock
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("TryAcquire after the row changed under it: got %v, want the lease", err)
		}
		if got := inspect(t, witness, "job"); !got.Held || got.Holder != "serializable" {
			t.Fatalf("after the acquire: got %+v, want held by serializable", got)
		}
	})
}

// Acquire waits out an outage: while no connection to the server can be
// made, each attempt fails with an error that may pass, and the call goes
// on polling until the server answers again.
func TestClient_Acquire_waitsOutAnOutage(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		// Prepared on a live connection, which the outage then breaks.
		warm := mustAcquire(t, f.c, "job", time.Minute)
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
		f.p.Refuse(true)
		f.p.CutAll()
		done := make(chan error, 1)
		go func() {
			l, err := f.c.Acquire(ctx, "job", time.Minute)
			if err == nil {
				err = l.Release(ctx)
			}
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // several attempts, refused
		select {
		case err := <-done:
			t.Fatalf("Acquire returned during the outage: %v", err)
		default:
		}
		f.p.Refuse(false)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Acquire after the outage: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Acquire still waiting 10s after the outage ended")
		}
	})
}

// Acquire's polling goes on through errors that may pass, counting each as
// an attempt, and stops on a final one.
func TestClient_Acquire_pollsThroughPassableErrors(t *testing.T) {
	for _, tc := range passableErrors {
		t.Run(tc.name, func(t *testing.T) {
			e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
			tok := &tokenArg{}
			args := acquireArgs("job", mockHolder, 1_000_000, tok)
			e.expectExec("acquire", args, errReply(tc.err), okReply(0, 1), errReply(tc.err), okReply(7, 1))
			l, err := e.c.Acquire(t.Context(), "job", time.Second)
			if err != nil {
				t.Fatalf("Acquire: got %v, want nil", err)
			}
			if l.Fence() != 7 {
				t.Errorf("fence: got %d, want 7", l.Fence())
			}
			e.done()
		})
	}
	t.Run("strategy gives up: the last error", func(t *testing.T) {
		e := newMockEnv(t, WithRetry(LimitRetry(LinearBackoff(time.Millisecond), 2)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly), errReply(errReadOnly))
		_, err := e.c.Acquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, errReadOnly)
		e.done()
	})
	t.Run("context ends: the last error too", func(t *testing.T) {
		t.Parallel() // waits out its deadline
		e := newMockEnv(t, WithRetry(LinearBackoff(time.Hour)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly))
		// Far enough that a loaded machine answers the first attempt
		// before it: then the error is the refusal, not the cancelled query.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := e.c.Acquire(ctx, "job", time.Second)
		assertErrIs(t, err, ErrNotAcquired, context.DeadlineExceeded, errReadOnly)
		e.done()
	})
	t.Run("final error ends it", func(t *testing.T) {
		e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly), errReply(errSyntax))
		_, err := e.c.Acquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, errSyntax)
		e.done()
	})
}
