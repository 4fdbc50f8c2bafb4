package sqllock

// sqlmock tests of the statements behind Do, Once, Check and List, and of
// the keep-alive's decisions: the exact SQL and arguments, and how each
// result and error is read.

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/sqllock/sqllock/internal/fault"
)

// expectQuery expects query name to run once with args, answered by rows,
// preparing it first if the Client has not yet.
func (e *mockEnv) expectQuery(name string, args []driver.Value, rows *sqlmock.Rows) {
	if e.prepared[name] == nil {
		e.expectPrepare(name)
	}
	e.mock.ExpectQuery(e.sql(name)).WithArgs(args...).WillReturnRows(rows)
}

func noop(context.Context, *Lock) error { return nil }

func TestDo_WithMinHold_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		tok := &tokenArg{}
		e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), okReply(42, 1))
		e.expectExec("release_at_least", []driver.Value{int64(90_000_250), "job", tok}, okReply(1, 1))
		if err := lockDo(e.c.TryAcquire(t.Context(), "job", time.Minute))(t.Context(), noop, WithMinHold(90*time.Second+250*time.Microsecond)); err != nil {
			t.Errorf("TryAcquire and Do: got %v, want nil", err)
		}
	})
}

func TestDo_WithMinHold_result(t *testing.T) {
	for _, rows := range []int64{0, 1} {
		e := newMockEnv(t)
		tok := &tokenArg{}
		e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), okReply(42, 1))
		// Insert id 0: the lease was not ours, whatever the rows say.
		e.expectExec("release_at_least", []driver.Value{int64(1_000_000), "job", tok}, okReply(0, rows))
		err := lockDo(e.c.TryAcquire(t.Context(), "job", time.Minute))(t.Context(), noop, WithMinHold(time.Second))
		assertErrIs(t, err, ErrLockLost, ErrNotHeld)
		e.done()
	}
}

func TestDo_badOptions(t *testing.T) {
	e := newMockEnv(t)
	for _, opts := range [][]DoOption{
		{WithMinHold(-time.Second)},
		{WithMinHold(MaxTTL + time.Second)},
		{WithSafetyMargin(-time.Second)},
		{WithSafetyMargin(time.Minute)}, // not below the ttl
	} {
		err := e.c.Do(t.Context(), "job", time.Minute, noop, opts...)
		if err == nil {
			t.Errorf("Do with a bad option: got nil, want an error")
		}
	}
	assertErrContains(t, e.c.Do(t.Context(), "job", time.Minute, nil), "nil func")
	e.assertNothingPrepared()
	e.done()
}

func TestLock_Check_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		l, tok := e.acquired("job")
		e.mock.ExpectBegin()
		e.mock.ExpectExec(e.sql("check")).WithArgs("job", tok).WillReturnResult(sqlmock.NewResult(0, 1))
		e.mock.ExpectExec(e.sql("check")).WithArgs("job", tok).WillReturnResult(sqlmock.NewResult(0, 0))
		e.mock.ExpectExec(e.sql("check")).WithArgs("job", tok).WillReturnError(errDeadlock)
		e.mock.ExpectRollback()
		tx, err := e.db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(t.Context(), tx); err != nil {
			t.Errorf("Check, row: got %v, want nil", err)
		}
		assertErrIs(t, l.Check(t.Context(), tx), ErrNotHeld)
		// Inside the user's transaction nothing is retried: it is rolled back.
		err = l.Check(t.Context(), tx)
		assertErrIs(t, err, errDeadlock)
		if errors.Is(err, ErrNotHeld) {
			t.Errorf("Check, deadlock: got %v, want an error that is not ErrNotHeld", err)
		}
		tx.Rollback()
	})
}

func TestClient_List(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		e.expectQuery("list", nil, sqlmock.NewRows([]string{"name", "holder", "fence", "us", "ahead"}).
			AddRow("a", "h1", 7, 1_500_000, -500_000).
			AddRow("b", "h2", 0, 1, -1))
		got, err := e.c.List(t.Context())
		if err != nil {
			t.Fatalf("List: got %v, want nil", err)
		}
		want := []Info{
			{Name: "a", Holder: "h1", Fence: 7, Held: true, TTL: 1500 * time.Millisecond, Age: 500 * time.Millisecond},
			{Name: "b", Holder: "h2", Fence: 0, Held: true, TTL: time.Microsecond, Age: time.Microsecond},
		}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("List: got %+v, want %+v", got, want)
		}
	})
}

func TestClient_Once_args(t *testing.T) {
	done := func() *sqlmock.Rows { return sqlmock.NewRows([]string{"1"}).AddRow(1) }
	notDone := func() *sqlmock.Rows { return sqlmock.NewRows([]string{"1"}) }
	// acquired expects a call that finds no record and takes the lease.
	acquired := func(e *mockEnv, tok *tokenArg) {
		e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
		e.expectExec("acquire", acquireArgs("seed", mockHolder, onceTTL.Microseconds(), tok), okReply(42, 1))
	}
	boom := errors.New("boom")
	tests := []struct {
		name    string
		expect  func(e *mockEnv, tok *tokenArg)
		fnErr   error
		wantRan bool
		wantErr []error
	}{
		{"runs and records", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
			e.expectExec("once_record", []driver.Value{"seed", tok}, okReply(1, 1))
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
		}, nil, true, nil},
		{"done before", func(e *mockEnv, tok *tokenArg) {
			e.expectQuery("once_done", []driver.Value{"seed"}, done())
		}, nil, false, nil},
		{"done while waiting", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, done())
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
		}, nil, false, nil},
		{"fn fails: no record", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
		}, boom, true, []error{boom}},
		{"taken over: record refused", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
			e.expectExec("once_record", []driver.Value{"seed", tok}, okReply(0, 1))
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 0))
		}, nil, true, []error{ErrLockLost, ErrNotHeld}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			tt.expect(e, &tokenArg{})
			ran, err := e.c.Once(t.Context(), "seed", func(_ context.Context, _ *Lock) error { return tt.fnErr })
			if ran != tt.wantRan {
				t.Errorf("ran: got %v, want %v", ran, tt.wantRan)
			}
			if tt.wantErr == nil && err != nil {
				t.Errorf("err: got %v, want nil", err)
			}
			assertErrIs(t, err, tt.wantErr...)
			e.done()
		})
	}
}

// A renewal that finds the lease gone ends the keep-alive's contexts with
// ErrLockLost at once, well before the deadline.
func TestLock_KeepAlive_notHeldIsLoss(t *testing.T) {
	t.Parallel() // waits a third of a 3 s lease
	e := newMockEnv(t)
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 3_000_000, tok), okReply(42, 1))
	e.expectExec("refresh", refreshArgs(3_000_000, "job", tok), okReply(0, 0))
	l, err := e.c.TryAcquire(t.Context(), "job", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kctx := l.KeepAlive(t.Context())
	<-kctx.Done()
	if left := time.Until(l.ValidUntil()); left < time.Second {
		t.Errorf("told %v before the lease could expire, want about two thirds of the ttl", left)
	}
	assertErrIs(t, context.Cause(kctx), ErrLockLost, ErrNotHeld)
	if got := e.c.Held(); len(got) != 0 {
		t.Errorf("Held after loss: got %v, want none", got)
	}
	e.done()
}

// Failed renewals are retried; one that succeeds keeps the contexts alive.
func TestLock_KeepAlive_failureIsNotLoss(t *testing.T) {
	t.Parallel() // waits a third of a 3 s lease
	e := newMockEnv(t)
	tok := &tokenArg{}
	// A 3 s lease: each renewal has 750 ms, and the retry after a failed
	// one comes well before the deadline, also on a loaded machine.
	e.expectExec("acquire", acquireArgs("job", mockHolder, 3_000_000, tok), okReply(42, 1))
	// The first renewal fails after its in-statement retries; the second
	// succeeds.
	e.expectExec("refresh", refreshArgs(3_000_000, "job", tok), append(repeatReply(errReply(errDeadlock), fault.MaxTransientAttempts), okReply(1, 1))...)
	e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
	l, err := e.c.TryAcquire(t.Context(), "job", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := l.ValidUntil()
	kctx := l.KeepAlive(t.Context())
	deadline := time.Now().Add(5 * time.Second)
	for !l.ValidUntil().After(first) {
		if time.Now().After(deadline) || kctx.Err() != nil {
			t.Fatalf("no successful renewal; context: %v", context.Cause(kctx))
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}
	if cause := context.Cause(kctx); errors.Is(cause, ErrLockLost) {
		t.Errorf("cause: got %v, want no loss", cause)
	}
	e.done()
}

func TestRenewBackoff(t *testing.T) {
	for _, tt := range []struct {
		ttl      time.Duration
		failures int
		want     time.Duration
	}{
		{time.Minute, 1, 10 * time.Millisecond},
		{time.Minute, 3, 40 * time.Millisecond},
		{time.Minute, 40, 6 * time.Second},
		{time.Second, 5, 100 * time.Millisecond},
		{MinTTL, 1, minBackoff},
	} {
		if got := renewBackoff(tt.ttl, tt.failures); got != tt.want {
			t.Errorf("renewBackoff(%v, %d): got %v, want %v", tt.ttl, tt.failures, got, tt.want)
		}
	}
}

func TestDefaultSafetyMargin(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		time.Second: 100 * time.Millisecond,
		time.Minute: 5 * time.Second,
		time.Hour:   maxDefaultSafetyMargin,
	} {
		if got := defaultSafetyMargin(ttl); got != want {
			t.Errorf("defaultSafetyMargin(%v): got %v, want %v", ttl, got, want)
		}
	}
}

// A keep-alive whose deadline fires after the lease's end (the process was
// stopped past it, as scripts/nemesis's pause does) says the lease may
// have expired already, not that it expires soon.
func TestLock_KeepAlive_lateDeadlineSaysExpired(t *testing.T) {
	for _, tt := range []struct {
		left time.Duration
		want string
	}{
		{300 * time.Millisecond, "may expire 100ms from now"},
		{-1500 * time.Millisecond, "may have expired 1.5"},
	} {
		l := &Lock{name: "n", validUntil: time.Now().Add(tt.left)}
		err := l.expiringErr(100*time.Millisecond, nil)
		if !errors.Is(err, ErrLockLost) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("lease ending in %v: got %v, want ErrLockLost saying %q", tt.left, err, tt.want)
		}
	}
}

// A Refresh whose reply is read after a pause longer than the lease (sent
// before SIGSTOP, answered after SIGCONT) ends the keep-alive saying the
// lease may have expired already; one that leaves the lease inside the
// margin says it may expire within it.
func TestLock_setValidUntil_lateReplySaysExpired(t *testing.T) {
	for _, tt := range []struct {
		until time.Duration
		want  string
	}{
		{50 * time.Millisecond, "may expire within the safety margin 100ms"},
		{-2 * time.Second, "may have expired 2"},
	} {
		e := newMockEnv(t)
		l := newLock(e.c, "n", strings.Repeat("a", 32), 1, time.Minute, time.Now().Add(time.Minute))
		kctx := l.keepAlive(context.Background(), 100*time.Millisecond)
		l.mu.Lock()
		l.setValidUntil(time.Now().Add(tt.until))
		l.mu.Unlock()
		<-kctx.Done()
		if err := context.Cause(kctx); !errors.Is(err, ErrLockLost) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("a Refresh leaving %v: got %v, want ErrLockLost saying %q", tt.until, err, tt.want)
		}
		l.stopKeepAlive(l.ka)
	}
}
