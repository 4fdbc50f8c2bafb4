package wait

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/sqllock/sqllock/observe"
)

// mockEngine returns an Engine on a sqlmock pool, with the channels off,
// its closing channel, and the error a wait that Close ends returns.
func mockEngine(t *testing.T) (*Engine, sqlmock.Sqlmock, chan struct{}, error) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	closing, closed := make(chan struct{}), errors.New("closed")
	texts := map[string]string{"look": "SELECT name FROM t WHERE name IN (?)", "wake_probe": "SELECT IS_USED_LOCK(?)"}
	e := &Engine{}
	e.Init(Config{DB: db, SQL: func(name string) string { return texts[name] },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Closing: closing, Closed: closed,
		Woke:        func(string, observe.WakeupState, time.Duration) {},
		NotAcquired: errNotAcquired, Errorf: fmt.Errorf,
		Passable: func(err error) bool { return errors.Is(err, errPassing) },
		HeldBy:   func(name string) error { return fmt.Errorf("%w: %q is held", errNotAcquired, name) }})
	t.Cleanup(e.Stop)
	return e, mock, closing, closed
}

// Init hands the Engine's parts what they need of the Client; Stop ends
// the looks, whose later questions get the closed error.
func TestEngine_Init_Stop(t *testing.T) {
	e, mock, _, closed := mockEngine(t)
	if e.channels.on || e.channels.max != 0 {
		t.Errorf("Wakeups 0: got On %v, Max %d; want the channels off", e.channels.on, e.channels.max)
	}
	mock.ExpectQuery("SELECT name FROM t WHERE name IN (X'6a6f62')").
		WillReturnRows(sqlmock.NewRows([]string{"name"}).AddRow([]byte("job")))
	if held, err := e.looks.held(context.Background(), "job"); err != nil || !held {
		t.Fatalf("before Stop: got %v, %v; want held", held, err)
	}
	e.Stop()
	if _, err := e.looks.held(context.Background(), "job"); err != closed {
		t.Errorf("after Stop: got %v, want the closed error", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// anyway outlives its parent's end, but keeps a Bounded parent's deadline.
func TestAnyway_bounded(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ctx, stop := anyway(parent, time.Hour)
	defer stop()
	if d, _ := ctx.Deadline(); time.Until(d) < 59*time.Minute {
		t.Errorf("unbounded: deadline in %v, want the hour", time.Until(d))
	}
	ctx2, stop2 := anyway(bounded(parent), time.Hour)
	defer stop2()
	if d, _ := ctx2.Deadline(); time.Until(d) > time.Second {
		t.Errorf("bounded: deadline in %v, want the parent's", time.Until(d))
	}
	cancel()
	if ctx.Err() != nil || ctx2.Err() != nil {
		t.Error("Anyway's context ended with its parent's cancel")
	}
	// A Bounded parent whose deadline is later than d: d bounds it.
	far, cancelFar := context.WithTimeout(context.Background(), time.Hour)
	defer cancelFar()
	ctx3, stop3 := anyway(bounded(far), time.Second)
	defer stop3()
	if d, _ := ctx3.Deadline(); time.Until(d) > time.Second {
		t.Errorf("bounded, later deadline: deadline in %v, want the second", time.Until(d))
	}
}
