package sqllock

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// A token whose acquire's outcome stayed unknown, and whose cleanup failed,
// is remembered: the next acquire of the name deletes its lease first, and
// forgets it once that DELETE removed the lease, when the acquire had one
// send that may have committed (its resend was refused).
func TestClient_TryAcquire_claimsUnknownAcquire_args(t *testing.T) {
	e := newMockEnv(t)
	lost := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, lost),
		errReply(errors.New("invalid connection")), errReply(errReadOnly))
	e.expectExec("release", releaseArgs("job", lost), errReply(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err == nil {
		t.Fatalf("TryAcquire: got nil, want an error")
	}
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Fatalf("tokens remembered: got %d, want 1", n)
	}
	e.expectExec("release", releaseArgs("job", lost), okReply(0, 1))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(9, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	if n := e.c.orphans.Count("job"); n != 0 {
		t.Errorf("tokens remembered after the claim: got %d, want 0", n)
	}
	// Other names, and later acquires, send nothing more.
	e.expectExec("acquire", acquireArgs("other", mockHolder, 1_000_000, &tokenArg{}), okReply(10, 1))
	if _, err := e.c.TryAcquire(t.Context(), "other", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	e.done()
}

// An Acquire whose first attempt's outcome stays unknown, and whose cleanup
// fails, retires that token (acquire.go, rule 1): its next attempt deletes
// the lease the token may hold, then acquires under a fresh one. A late
// DELETE by the old token then cannot take the Lock's lease, and no later
// acquire of the name in the Client sends one with the Lock's token.
func TestClient_Acquire_unknownAttemptThenLease_tokenRetired(t *testing.T) {
	e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
	old, fresh := &tokenArg{}, &tokenArg{}
	lost := errors.New("invalid connection")
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, old), repeatReply(errReply(lost), fault.MaxTransientAttempts)...)
	e.expectExec("release", releaseArgs("job", old), errReply(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}))
	// The next attempt deletes what the lost one took, then takes the name
	// under a token of its own.
	e.expectExec("release", releaseArgs("job", old), okReply(0, 1))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, fresh), okReply(42, 1))
	l, err := e.c.Acquire(t.Context(), "job", time.Second)
	if err != nil {
		t.Fatalf("Acquire: got %v, want nil", err)
	}
	if l.Token() != fresh.token || fresh.token == old.token {
		t.Errorf("Lock token: got %q, want the fresh %q, not the retired %q", l.Token(), fresh.token, old.token)
	}
	// Four sends were lost: the DELETE removed what one of them wrote, and
	// another may still be in flight. The token stays remembered until no
	// send of it can commit, and each acquire of the name deletes again.
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Errorf("tokens remembered after the DELETE removed the lease of one of four lost sends: got %d, want 1", n)
	}
	// Another acquire of the name sends no DELETE with the Lock's token.
	e.expectExec("release", releaseArgs("job", old), okReply(0, 0))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(0, 0))
	_, err = e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrIs(t, err, ErrNotAcquired)
	e.done()
}

// An attempt whose first send was lost and whose resend was refused may
// still take the name later, when the other owner's lease ends: its token is
// remembered whatever the answer (rule 2), and the next acquire of the name
// deletes that lease first.
func TestClient_TryAcquire_lostSendThenRefused_tokenRemembered(t *testing.T) {
	e := newMockEnv(t)
	old := &tokenArg{}
	lost := errors.New("invalid connection")
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, old), errReply(lost), okReply(0, 0))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrIs(t, err, ErrNotAcquired)
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Fatalf("tokens remembered after a lost send and a refusal: got %d, want 1", n)
	}
	e.expectExec("release", releaseArgs("job", old), okReply(0, 0))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(43, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	e.done()
}

func TestClient_TryAcquire_retries(t *testing.T) {
	if fault.MaxTransientAttempts < 2 {
		t.Fatalf("fault.MaxTransientAttempts: got %d, want at least 2", fault.MaxTransientAttempts)
	}
	for _, tc := range transientErrors {
		if errors.Is(tc.err, errLockWait) {
			continue // the acquire reports its row held: TestClient_TryAcquire_rowLockedIsHeld
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each its own mock: "bounded" waits out a deadline
			failures := fault.MaxTransientAttempts - 1
			if tc.rolledBack {
				failures = manyConflicts
			}
			t.Run("then success, same token", func(t *testing.T) {
				// A budget no load outlasts: CI's load (six test groups
				// under -race) once made ten mock sends outlast 5 s.
				e := newMockEnv(t, withRetryBudget(fault.Budget{Max: time.Minute, Backoff: func(int) time.Duration { return time.Millisecond }}))
				tok := &tokenArg{}
				replies := append(repeatReply(errReply(tc.err), failures), okReply(7, 1))
				e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), replies...)
				l, err := e.c.TryAcquire(t.Context(), "job", time.Second)
				if err != nil {
					t.Fatalf("TryAcquire: got %v, want nil", err)
				}
				if l.Fence() != 7 || l.Token() != tok.token {
					t.Errorf("Lock: got fence %d token %q, want fence 7 token %q", l.Fence(), l.Token(), tok.token)
				}
				e.done()
			})
			t.Run("bounded", func(t *testing.T) {
				tok := &tokenArg{}
				if tc.rolledBack {
					e := newMockEnv(t, quickRetries)
					// Conflicts go on past the Client's budget: the
					// retries stop within it (internal/fault's TestRetry
					// shows they stop within a context's deadline too).
					// The deadline is far enough that a loaded machine
					// answers the first attempt before it (the error is
					// then the conflict, not the cancelled query: at a
					// load average of 11, 2 s was not).
					e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), repeatReply(errReply(tc.err), 10_000)...)
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					defer cancel()
					_, err := e.c.TryAcquire(ctx, "job", time.Second)
					assertErrIs(t, err, tc.err)
					return
				}
				// A broken connection ends after MaxTransientAttempts
				// sends, within the library's budget.
				e := newMockEnv(t, quickBackoff)
				e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok),
					repeatReply(errReply(tc.err), fault.MaxTransientAttempts)...)
				// The cleanup of the unknown outcome.
				e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
				_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
				assertErrIs(t, err, tc.err)
				if errors.Is(err, ErrNotAcquired) {
					t.Errorf("got %v, want an error not wrapping %v", err, ErrNotAcquired)
				}
				e.done()
			})
		})
	}
}

// A server that refuses to run the statement (read-only during a failover,
// no server listening) applied nothing: the operation returns at once, for
// the loops above it to pace their retries, and sends no cleanup.
func TestClient_TryAcquire_refusedNotRetried(t *testing.T) {
	dialRefused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, refused := range []error{errReadOnly, dialRefused} {
		t.Run(refused.Error(), func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(refused))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, refused)
			if n := e.c.orphans.Count("job"); n != 0 {
				t.Errorf("tokens remembered: got %d, want 0", n)
			}
			e.done()
		})
	}
}

func TestClient_TryAcquire_finalErrorNotRetried(t *testing.T) {
	for _, final := range []error{errSyntax, errors.New("boom")} {
		t.Run(final.Error(), func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(final))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, final)
			e.done()
		})
	}
}
