package sqllock

import (
	"context"
	"testing"
	"time"
)

// A call that needs a statement another call is preparing on a dead
// connection waits only as long as its own context allows.
func TestClient_stuckPrepare_waitsEndWithTheirContext(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		go func() { _, _ = c.TryAcquire(testCtx(t), "x", time.Minute) }()
		waitCommand(t, p, proxyComQuery) // the first use's check (first_use)
		calls := []struct {
			name string
			call func(ctx context.Context) error
		}{
			{"TryAcquire", func(ctx context.Context) error { _, err := c.TryAcquire(ctx, "x", time.Minute); return err }},
			{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, "y", time.Minute); return err }},
			{"Inspect", func(ctx context.Context) error { _, err := c.Inspect(ctx, "x"); return err }},
		}
		for _, call := range calls {
			t.Run(call.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				err := within(t, call.name, func() error { return call.call(ctx) })
				wantErrIs(t, err, context.DeadlineExceeded)
			})
		}
	})
}

// A call waiting for a prepare whose caller gave up prepares anew under its
// own context, rather than failing with the other caller's context's error.
func TestClient_stuckPrepare_waiterOutlivesPreparer(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		ctx := testCtx(t)
		first, cancelFirst := context.WithCancel(ctx)
		firstDone := make(chan error, 1)
		go func() {
			_, err := c.TryAcquire(first, "x", time.Minute)
			firstDone <- err
		}()
		waitCommand(t, p, proxyComQuery)
		secondDone := make(chan error, 1)
		go func() {
			_, err := c.TryAcquire(ctx, "y", time.Minute)
			secondDone <- err
		}()
		time.Sleep(100 * time.Millisecond) // let it join the prepare
		cancelFirst()
		wantErrIs(t, within(t, "first TryAcquire", func() error { return <-firstDone }), context.Canceled)
		p.Stall(false)
		if err := within(t, "second TryAcquire", func() error { return <-secondDone }); err != nil {
			t.Fatalf("second TryAcquire: got %v, want nil", err)
		}
	})
}

// A query whose statement Close closed under it (Once's check for a
// completion record, Inspect, List) reports ErrClosed, as a write does, not
// database/sql's "statement is closed".
func TestClient_query_statementClosedUnderIt(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		st, err := c.eng.Stmt(ctx, qOnceDone)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = st.QueryContext(ctx, "job")
		if err == nil {
			t.Fatal("query on a statement Close closed: got no error")
		}
		wantErrIs(t, c.serverError("once", err), ErrClosed)
	})
}
