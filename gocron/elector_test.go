package gocronlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
	"github.com/sqllock/sqllock/observe"
)

// IsLeader follows the lead: one of two Electors leads, and when it closes
// the other takes over.
func TestElector_handover(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, other := newClients(t, s.DSN)
		ctx := context.Background()
		a, b := leaderAndFollower(t, c, other)
		time.Sleep(300 * time.Millisecond)
		if err := b.IsLeader(ctx); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("b while a leads: got %v, want ErrNotLeader", err)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := a.IsLeader(ctx); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("a after Close: got %v, want ErrNotLeader", err)
		}
		waitUntil(t, "b to take over", func() bool { return b.IsLeader(ctx) == nil })
	})
}

// The Elector's campaign is told to the Client's Observer as acquires
// (issue 43): the attempt that took the lead, and the other scheduler's
// while it leads. Before, a service that scheduled through an Elector
// showed no acquire in metrics; otel's TestPrometheus_electAndOnceScraped
// scrapes the same events through the Prometheus exporter.
func TestElector_observed(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		var seen acquiresSeen
		c, other := newClients(t, s.DSN, sqllock.WithObserver(seen.observer()))
		leaderAndFollower(t, c, other)
		name := DefaultPrefix + "lead"
		waitUntil(t, "the follower's attempts to be told", func() bool { return seen.count(name, observe.OutcomeHeld) > 0 })
		// At least the lead a took; a loaded machine may pass the lead
		// (a second's ttl) and tell another.
		if n := seen.count(name, observe.OutcomeAcquired); n < 1 {
			t.Errorf("acquires told acquired: got %d, want at least 1", n)
		}
	})
}

// leaderAndFollower returns an Elector on c that leads "lead", with a ttl
// of a second, and then one on other; both are closed when the test ends.
func leaderAndFollower(t *testing.T, c, other *sqllock.Client) (a, b *Elector) {
	t.Helper()
	ctx := context.Background()
	a, err := NewElector(ctx, c, "lead", WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	waitUntil(t, "a to lead", func() bool { return a.IsLeader(ctx) == nil })
	b, err = NewElector(ctx, other, "lead", WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

// Issue 21: with a missing table, NewElector returned no error and never
// led; the error came only at Close.
func TestNewElector_missingTable(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db := openDB(t, s.DSN)
		c, err := sqllock.New(db, sqllock.WithTable(newTable(t, db, "gocron_missing_")))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		e, err := NewElector(context.Background(), c, "lead")
		if err == nil || !strings.Contains(err.Error(), "does not exist") {
			t.Fatalf("NewElector: got %v, %v, want an error saying the table does not exist", e, err)
		}
	})
}

// A campaign that ends for good (here: the table was dropped) is logged,
// and IsLeader says why.
func TestElector_campaignEnded(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, table := newClient(t, s.DSN)
		ctx := context.Background()
		var log logBuffer
		e, err := NewElector(ctx, c, "lead", WithTTL(time.Second), WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		waitUntil(t, "e to lead", func() bool { return e.IsLeader(ctx) == nil })
		if _, err := openDB(t, s.DSN).Exec("DROP TABLE `" + table + "`"); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the end of the campaign to be logged", func() bool { return log.Contains("level=ERROR") })
		err = e.IsLeader(ctx)
		if !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), "campaign ended") {
			t.Errorf("IsLeader: got %v, want ErrNotLeader and why the campaign ended", err)
		}
		t.Logf("logged: %s", log.String())
	})
}
