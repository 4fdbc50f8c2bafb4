package gocronlock

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
	"github.com/sqllock/sqllock/observe"
)

func TestMain(m *testing.M) {
	testdsn.QuietDriver() // the scheduler processes' too: the tests' own
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(schedulerMain(spec)) // a scheduler process of schedulers_test.go
	}
	if spec := os.Getenv(unnamedEnv); spec != "" {
		os.Exit(unnamedMain(spec)) // TestLocker_Lock_unnamedTaskJobPanics's
	}
	testdsn.Parallel() // several tests at once on every server
	os.Exit(m.Run())
}

func TestOptions_refused(t *testing.T) {
	for _, opt := range []Option{
		WithTTL(999 * time.Millisecond),
		WithMinHold(-time.Second),
		WithJobMinHold("job", -time.Second),
		WithLockTimeout(0),
	} {
		if _, err := newConfig([]Option{opt}); err == nil {
			t.Errorf("newConfig: got nil, want an error")
		}
	}
	if _, err := NewLocker(context.Background(), nil); err == nil {
		t.Error("NewLocker(nil): got nil, want an error")
	}
	if _, err := NewElector(context.Background(), nil, "x"); err == nil {
		t.Error("NewElector(nil): got nil, want an error")
	}
}

// newTable returns a fresh table name, dropped through db when the test
// ends.
func newTable(t *testing.T, db *sql.DB, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	table := prefix + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if _, err := db.Exec("DROP TABLE IF EXISTS `" + table + "`"); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	return table
}

// newClient returns a Client on a fresh table of its own, dropped when the
// test ends, and the table's name.
func newClient(t *testing.T, dsn string, opts ...sqllock.Option) (*sqllock.Client, string) {
	t.Helper()
	db := openDB(t, dsn)
	table := newTable(t, db, "gocron_")
	c, err := sqllock.New(db, append(opts, sqllock.WithTable(table))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // before the table is dropped
	if err := c.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c, table
}

// newClients returns two Clients on one fresh table, as two schedulers'
// would have, closed and dropped when the test ends; opts apply to both.
func newClients(t *testing.T, dsn string, opts ...sqllock.Option) (c, other *sqllock.Client) {
	t.Helper()
	c, table := newClient(t, dsn, opts...)
	other, err := sqllock.New(openDB(t, dsn), append(opts, sqllock.WithTable(table))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	return c, other
}

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after 10s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logBuffer is a logger whose records a test reads back.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) Contains(s string) bool { return strings.Contains(b.String(), s) }

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// acquiresSeen counts the acquire events a Client's Observer is told, by
// name and outcome.
type acquiresSeen struct {
	mu sync.Mutex
	n  map[string]int // name, " ", outcome
}

func (s *acquiresSeen) observer() observe.Observer {
	return observe.Observer{AcquireDone: func(ev observe.AcquireEvent) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.n == nil {
			s.n = map[string]int{}
		}
		s.n[ev.Name+" "+ev.Outcome.String()]++
	}}
}

func (s *acquiresSeen) count(name string, o observe.Outcome) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[name+" "+o.String()]
}
