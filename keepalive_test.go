package sqllock

import (
	"context"
	"testing"
	"time"
)

// A renewal that fails with a final error (the table is gone) ends the
// keep-alive at once: no renewal can succeed before the deadline.
func TestLock_KeepAlive_finalErrorIsLoss(t *testing.T) {
	t.Parallel() // waits a third of a 3 s lease
	e := newMockEnv(t)
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 3_000_000, tok), okReply(42, 1))
	e.expectExec("refresh", refreshArgs(3_000_000, "job", tok), errReply(errNoSuchTable))
	l, err := e.c.TryAcquire(t.Context(), "job", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kctx := l.KeepAlive(t.Context())
	<-kctx.Done()
	if left := time.Until(l.ValidUntil()); left < time.Second {
		t.Errorf("told %v before the lease could expire, want about two thirds of the ttl", left)
	}
	assertErrIs(t, context.Cause(kctx), ErrLockLost, errNoSuchTable)
	e.done()
}
