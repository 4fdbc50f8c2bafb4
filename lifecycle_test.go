package sqllock

import (
	"fmt"
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
