package sqllock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Real-server tests of how a Client and its Locks begin and end: Close
// against the calls it races, prepares and waits that a dead connection
// holds up, and keep-alives against Release and Refresh. A stuck call is
// detected by a watchdog far longer than any healthy run needs: a liveness
// bound, not a timing claim.

// stuckLimit is how long a call may take, in these tests, before it counts
// as held up by another that waits on a stalled connection.
const stuckLimit = 20 * time.Second

// within runs f in a goroutine and returns its error, failing the test if f
// has not returned after stuckLimit.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(stuckLimit):
		t.Fatalf("%s still blocked after %v", what, stuckLimit)
		return nil
	}
}

// waitCommand waits until the proxy has received a command with code since
// its counts were reset.
func waitCommand(t *testing.T, p *proxy, code byte) {
	t.Helper()
	waitFor(t, stuckLimit, fmt.Sprintf("command 0x%02x at the proxy", code), func() bool {
		return p.Commands()[code] > 0
	})
}

// stalledClient returns a fresh Client whose every connection goes through
// a proxy, and the proxy, stalled; the stall ends when the test does.
func stalledClient(t *testing.T, e *testEnv) (*Client, *proxy) {
	t.Helper()
	c, p := e.proxiedClient(t, e.newTable(t))
	// A connection in the pool, so that the Client's first command reaches
	// the proxy; a new connection's handshake would stall before it.
	if err := c.db.PingContext(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	p.ResetCounts()
	p.Stall(true)
	t.Cleanup(func() { p.Stall(false) })
	return c, p
}

// closeWhileAcquireStuck starts a TryAcquire of "x" on c, whose proxy p
// stalls, and once p has received command code, Close: Close must return,
// and the acquire too once p lets the command through, with ErrClosed.
func closeWhileAcquireStuck(t *testing.T, c *Client, p *proxy, code byte) {
	t.Helper()
	acquired := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(testCtx(t), "x", time.Minute)
		acquired <- err
	}()
	waitCommand(t, p, code)
	if err := within(t, "Close", c.Close); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p.Stall(false)
	wantErrIs(t, within(t, "TryAcquire", func() error { return <-acquired }), ErrClosed)
}

// randomCall makes one call of the lease API, chosen at random, on name;
// onceName is for Once.
func randomCall(c *Client, name, onceName string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pause := func() { time.Sleep(rand.N(3 * time.Millisecond)) }
	switch rand.N(8) {
	case 6: // a set left for Close to release (refused through Vitess)
		_, err := c.TryAcquireSet(ctx, []string{name, name + "-set"}, time.Minute)
		if errors.Is(err, errors.ErrUnsupported) {
			return nil
		}
		return err
	case 7:
		err := lockDo(c.AcquireSet(ctx, []string{name + "-set", name}, time.Minute))(ctx, func(_ context.Context, _ *Lock) error { pause(); return nil })
		if errors.Is(err, errors.ErrUnsupported) {
			return nil
		}
		return err
	case 0: // a lease left for Close to release
		_, err := c.TryAcquire(ctx, name, time.Minute)
		return err
	case 1:
		l, err := c.Acquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		pause()
		return l.Release(ctx)
	case 2:
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		kctx := l.KeepAlive(ctx)
		pause()
		if err := l.Refresh(ctx, time.Minute); err != nil {
			return err
		}
		err = l.Release(ctx)
		if kctx.Err() == nil {
			return errors.New("a keep-alive's context outlived Release")
		}
		return err
	case 3:
		return c.Do(ctx, name, time.Minute, func(_ context.Context, _ *Lock) error { pause(); return nil })
	case 4:
		_, err := c.Once(ctx, onceName, func(_ context.Context, _ *Lock) error { pause(); return nil })
		return err
	default:
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		released := make(chan error, 1)
		go func() { released <- l.Release(ctx) }()
		kctx := l.KeepAlive(ctx) // racing the Release
		err = <-released
		if kctx.Err() == nil {
			return errors.New("a keep-alive's context outlived Release")
		}
		return err
	}
}

// expectedDuringClose reports whether err is one a call racing Close may
// return: the Client closed, the name held by another call, or a lease
// released by Close under it.
func expectedDuringClose(err error) bool {
	return errors.Is(err, ErrClosed) || errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrNotHeld)
}
