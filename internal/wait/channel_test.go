package wait

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
	"github.com/sqllock/sqllock/observe"
)

// The wake-up channels against real servers: two Engines on their own
// pools stand for two processes. The root package's wake tests prove what
// the channels do for leases; these prove the machinery's own promises.

// The channel statements of queries.sql, for a table of the test's own so
// that the servers' subtests, run at once, never share a named lock.
func channelSQL(table string) (wait, release, probe string) {
	lock := "CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), '" + table + "', ?), 256), 56))"
	return "SELECT IS_FREE_LOCK(" + lock + "), GET_LOCK(" + lock + ", ?)",
		"SELECT RELEASE_LOCK(" + lock + ")",
		"SELECT IS_USED_LOCK(" + lock + ")"
}

// twoProcesses returns two Engines on pools of their own, sharing the
// channels of a table of the test's own, and the error they return once
// closed.
func twoProcesses(t *testing.T, s testdsn.Server) (a, b *Engine, closed error) {
	t.Helper()
	table := fmt.Sprintf("%s_%d", t.Name(), time.Now().UnixNano())
	closed = errors.New("closed")
	return newEngine(t, s, table, closed), newEngine(t, s, table, closed), closed
}

// newEngine returns an Engine on a pool of its own.
func newEngine(t *testing.T, s testdsn.Server, table string, closed error) *Engine {
	t.Helper()
	return engineOn(t, openDB(t, s.DSN), table, closed, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// openDB opens a pool on dsn, closed when t ends.
func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// engineOn returns an Engine on db that logs to log.
func engineOn(t *testing.T, db *sql.DB, table string, closed error, log *slog.Logger) *Engine {
	t.Helper()
	closing := make(chan struct{})
	w, r, p := channelSQL(table)
	texts := map[string]string{"wake_wait": w, "wake_release": r, "wake_probe": p, "look": "SELECT 1 FROM DUAL WHERE 0 IN (?)"}
	e := &Engine{}
	e.Init(Config{DB: db, Wakeups: 10, SQL: func(name string) string { return texts[name] },
		Log: log, Closing: closing, Closed: closed,
		Woke: func(string, observe.WakeupState, time.Duration) {}})
	t.Cleanup(func() {
		select {
		case <-closing:
		default:
			close(closing)
		}
		e.Stop()
		e.channels.closeAll(context.Background())
	})
	return e
}

// Stop ends a wait in GET_LOCK at once with the closed error, and CloseAll
// lets go of every channel held.
func TestChannels_Stop_endsWaits(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		a, b, closed := twoProcesses(t, s)
		ctx := context.Background()
		if st, _, err := a.channels.wait(ctx, "k", time.Second); err != nil || st != stGranted {
			t.Fatalf("a: %v, %v", st, err)
		}
		done := make(chan error, 1)
		go func() {
			_, _, err := b.channels.wait(ctx, "k", 5*time.Second)
			done <- err
		}()
		time.Sleep(200 * time.Millisecond) // b is in GET_LOCK, or about to be: either way Stop ends it
		began := time.Now()
		b.Stop()
		select {
		case err := <-done:
			if err != closed {
				t.Errorf("b's wait after Stop: got %v, want the closed error", err)
			}
			if d := time.Since(began); d > time.Second {
				t.Errorf("b's wait ended %v after Stop", d)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("Stop did not end b's wait")
		}
		a.Stop()
		a.channels.closeAll(ctx)
		if a.channels.holds("k") || a.channels.inUse() != 0 {
			t.Error("CloseAll left the channel held")
		}
		// Stop ended b's wait on the client; on the server its session may
		// still wait in GET_LOCK (it learns of the closed connection when
		// it answers), be granted the channel a let go of, and let it go
		// as it ends: a hold of a few milliseconds, longer on a loaded
		// machine, that CI's run saw on every server. A channel CloseAll
		// left held stays held; that one ends within b's wait (5 s).
		for deadline := time.Now().Add(10 * time.Second); used(t, b); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the channel is still held 10 s after CloseAll")
			}
		}
		if _, _, err := a.channels.wait(ctx, "k", time.Second); err != closed {
			t.Errorf("a wait after CloseAll: got %v, want the closed error", err)
		}
	})
}

// used reports whether anyone holds the channel of "k", asked on e's pool.
func used(t *testing.T, e *Engine) bool {
	t.Helper()
	return usedKey(t, e, "k")
}

// usedKey reports whether anyone holds the channel of key, asked on e's
// pool.
func usedKey(t *testing.T, e *Engine, key string) bool {
	t.Helper()
	var id sql.NullInt64
	if err := e.channels.db.QueryRow(strings.Replace(e.channels.sql("wake_probe"), "?", "'"+key+"'", 1)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id.Valid
}

func TestMain(m *testing.M) {
	testdsn.QuietDriver()
	// One test at a time: the tests share the channel names ("k"), whose
	// GET_LOCK names are the server's, not a table's.
	testdsn.Serial = true
	testdsn.Parallel()
	os.Exit(m.Run())
}
