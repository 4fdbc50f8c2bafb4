package sqllock

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Elect whose server is down the whole time returns its context's error
// wrapping the last error it met: the caller learns why it never led.
func TestElect_serverDown_returnsLastError(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = closedAddr(t) })
		c := e.client(t, db, "sqllock")
		ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
		defer cancel()
		err := c.Elect(ctx, "leader", time.Second, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Elect with no server: got %v, want DeadlineExceeded wrapping the refused connection", err)
		}
	})
}

// A candidate whose server is read-only (a replica during a failover) keeps
// campaigning, and leads once the server takes writes: on the tests' own
// server, which may be made read-only.
func TestClient_Elect_readOnlyServer_leadsAfter(t *testing.T) {
	if os.Getenv(ownServerEnv) == "" {
		t.Skipf("set %s when the test server is the tests' own, to make it read-only", ownServerEnv)
	}
	soleServer(t, "makes the server read-only under "+ownServerEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, limitedUser(t, e, table), table)
		setGlobal(t, e, "read_only", "ON", "OFF")
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		led := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- c.Elect(ctx, "leader", 200*time.Millisecond, Callbacks{
				OnStartedLeading: func(_ context.Context, _ *Lock) error { close(led); return nil },
			})
		}()
		time.Sleep(500 * time.Millisecond) // several refused attempts
		select {
		case <-led:
			t.Fatalf("led while the server was read-only")
		case err := <-done:
			t.Fatalf("Elect returned while the server was read-only: %v", err)
		default:
		}
		if _, err := e.db.Exec("SET GLOBAL read_only = OFF"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-led:
		case err := <-done:
			t.Fatalf("Elect returned instead of leading: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no lead 10s after the server took writes again")
		}
		cancel()
		wantErrIs(t, <-done, context.Canceled)
	})
}
