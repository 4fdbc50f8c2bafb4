package sqllock

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/sqllock/sqllock/internal/fault"
)

func TestNew_WithTable(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatalf("sqlmock.New: got %v, want nil", err)
	}
	defer db.Close()
	c, err := New(db, WithTable("my_locks"))
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	for i, name := range stmtNames {
		// Before the first use has found the database, the table alone.
		want := strings.ReplaceAll(queries[name], "`sqllock`", "`my_locks`")
		if c.eng.Forms().SQL[i] != want {
			t.Errorf("%s: got %q, want %q", name, c.eng.Forms().SQL[i], want)
		}
		if strings.Contains(c.eng.Forms().SQL[i], "`sqllock`") {
			t.Errorf("%s: got %q, want no `sqllock` left", name, c.eng.Forms().SQL[i])
		}
	}
}

func TestNew_badOptions(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatalf("sqlmock.New: got %v, want nil", err)
	}
	defer db.Close()

	if c, err := New(nil); c != nil || err == nil {
		t.Errorf("New(nil): got %v, %v, want nil and an error", c, err)
	} else {
		assertErrContains(t, err, "nil *sql.DB")
	}

	tests := []struct {
		name string
		opt  Option
		want []string
	}{
		{"empty table", WithTable(""), []string{"bad table name", `""`}},
		{"table with a dash", WithTable("a-b"), []string{"bad table name", `"a-b"`}},
		{"table with SQL", WithTable("x;drop"), []string{"bad table name", `"x;drop"`}},
		{"table of 65 chars", WithTable(strings.Repeat("t", 65)), []string{"bad table name", "1 to 64"}},
		{"quoted table", WithTable("`t`"), []string{"bad table name", "\"`t`\""}},
		{"empty holder", WithHolder(""), []string{"empty holder description"}},
		{"holder of 256 bytes", WithHolder(strings.Repeat("h", maxHolderLen+1)), []string{"holder description is 256 bytes", "longer than"}},
		{"holder of a lock-delay", WithHolder("lock-delay after a forced release of a"), []string{`holder description "lock-delay after a forced release of a" begins as a lock-delay's`}},
		{"nil RetryStrategy", WithRetry(nil), []string{"nil RetryStrategy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(db, tt.opt)
			if c != nil {
				t.Errorf("Client: got %v, want nil", c)
			}
			assertErrContains(t, err, tt.want...)
		})
	}

	t.Run("limits accepted", func(t *testing.T) {
		_, err := New(db, WithTable(strings.Repeat("t", 64)), WithHolder(strings.Repeat("h", maxHolderLen)))
		if err != nil {
			t.Errorf("got %v, want nil", err)
		}
	})
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Errorf("ExpectationsWereMet: got %v, want nil", err)
	}
}

func TestWithLockDelay_bad(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, d := range []time.Duration{-time.Nanosecond, MaxTTL + 1} {
		if c, err := New(db, WithLockDelay(d)); c != nil || err == nil {
			t.Errorf("WithLockDelay(%v): got %v, %v, want an error", d, c, err)
		}
	}
}

// A nil logger logs nothing, and works.
func TestWithLogger_nil(t *testing.T) {
	e := newMockEnv(t, WithLogger(nil))
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), errReply(errDeadlock), okReply(42, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.done()
}

// Wake-up channels are on by default, four at once; WithWakeups sets how
// many, 0 turns them off, and a negative count is refused in New, naming
// the problem, before anything is sent.
func TestWithWakeups(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		opts []Option
		on   bool
		max  int
	}{
		{nil, true, defaultWakeups},
		{[]Option{WithWakeups(0)}, false, 0},
		{[]Option{WithWakeups(16)}, true, 16},
	} {
		c, err := New(db, tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if (c.wait.Peek("").Wakeups > 0) != tc.on || c.wait.Peek("").Wakeups != tc.max {
			t.Errorf("New(%d options): got on %v, %d channels; want %v, %d", len(tc.opts), (c.wait.Peek("").Wakeups > 0), c.wait.Peek("").Wakeups, tc.on, tc.max)
		}
	}
	if defaultWakeups != 4 {
		t.Errorf("defaultWakeups: got %d, want the 4 the docs state", defaultWakeups)
	}
	if _, err := New(db, WithWakeups(-1)); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("WithWakeups(-1): got %v, want an error that says the count is negative", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

func TestClient_Do_badOptions(t *testing.T) {
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

func TestNoRetry(t *testing.T) {
	s := NoRetry()
	for _, attempt := range []int{1, 2, 100} {
		if _, ok := s.Backoff(attempt); ok {
			t.Errorf("Backoff(%d): got ok true, want false", attempt)
		}
	}
}

func TestLinearBackoff(t *testing.T) {
	tests := []struct {
		d, want time.Duration
	}{
		{50 * time.Millisecond, 50 * time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{0, time.Millisecond},
		{-time.Second, time.Millisecond},
	}
	for _, tt := range tests {
		s := LinearBackoff(tt.d)
		for _, attempt := range []int{1, 2, 100} {
			if got, ok := s.Backoff(attempt); got != tt.want || !ok {
				t.Errorf("LinearBackoff(%v).Backoff(%d): got %v, %v, want %v, true", tt.d, attempt, got, ok, tt.want)
			}
		}
	}
}

func TestExponentialBackoff(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name         string
		first, limit time.Duration
		steps        []time.Duration // the step of attempts 1, 2, ...; the last repeats
	}{
		{"doubling up to the limit", 10 * ms, 80 * ms, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 80 * ms}},
		{"capped between doublings", 7 * ms, 20 * ms, []time.Duration{7 * ms, 14 * ms, 20 * ms}},
		{"limit below first raised to first", 10 * ms, 5 * ms, []time.Duration{10 * ms}},
		{"zero first raised to 1ms", 0, 4 * ms, []time.Duration{ms, 2 * ms, 4 * ms}},
		{"negatives raised to 1ms", -time.Second, -time.Second, []time.Duration{ms}},
		{"defaults", defaultRetryMin, defaultRetryMax, []time.Duration{8 * ms, 16 * ms, 32 * ms, 64 * ms, 128 * ms, 256 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ExponentialBackoff(tt.first, tt.limit)
			limit := tt.steps[len(tt.steps)-1]
			for _, attempt := range []int{1, 2, 3, 4, 5, 6, 7, 10, 100, 1000} {
				step := limit
				if attempt <= len(tt.steps) {
					step = tt.steps[attempt-1]
				}
				seen := map[time.Duration]bool{}
				for range 200 {
					got, ok := s.Backoff(attempt)
					if !ok || got < step/2 || got > step {
						t.Fatalf("Backoff(%d): got %v, %v, want within [%v, %v], true", attempt, got, ok, step/2, step)
					}
					seen[got] = true
				}
				if len(seen) < 2 {
					t.Errorf("Backoff(%d): got %d distinct waits in 200, want jitter", attempt, len(seen))
				}
			}
		})
	}
}

func TestLimitRetry(t *testing.T) {
	// attempts counts the attempts Acquire would make under s.
	attempts := func(s RetryStrategy) int {
		n := 1
		for ; n < 1000; n++ {
			if _, ok := s.Backoff(n); !ok {
				break
			}
		}
		return n
	}
	for _, n := range []int{1, 2, 3, 10} {
		s := LimitRetry(LinearBackoff(5*time.Millisecond), n)
		if got := attempts(s); got != n {
			t.Errorf("LimitRetry(s, %d): got %d attempts, want %d", n, got, n)
		}
		for attempt := 1; attempt < n; attempt++ {
			if got, ok := s.Backoff(attempt); got != 5*time.Millisecond || !ok {
				t.Errorf("LimitRetry(s, %d).Backoff(%d): got %v, %v, want 5ms, true", n, attempt, got, ok)
			}
		}
	}
	if got := attempts(LimitRetry(NoRetry(), 5)); got != 1 {
		t.Errorf("LimitRetry(NoRetry(), 5): got %d attempts, want 1", got)
	}
}

// Options for mock tests that only wait on the resends' budget and backoff:
// quickRetries ends the rollbacks' resends within 100 ms, pausing 1 ms
// between them; quickBackoff keeps the library's budget, so that a test
// sees the resends end at a lease's end, with the same pause.
var (
	quickRetries = withRetryBudget(fault.Budget{Max: 100 * time.Millisecond, Backoff: func(int) time.Duration { return time.Millisecond }})
	quickBackoff = withRetryBudget(fault.Budget{Backoff: func(int) time.Duration { return time.Millisecond }})
)

// withRetryBudget reaches every statement's resends: an acquire rolled back
// without end stops within the Client's budget, pausing as its Backoff says.
func TestWithRetryBudget(t *testing.T) {
	pauses := 0
	e := newMockEnv(t, withRetryBudget(fault.Budget{Max: 50 * time.Millisecond, Backoff: func(int) time.Duration {
		pauses++
		return 5 * time.Millisecond
	}}))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), repeatReply(errReply(errDeadlock), 1000)...)
	start := time.Now()
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	if took := time.Since(start); !errors.Is(err, errDeadlock) || took > 3*time.Second {
		t.Fatalf("TryAcquire: got %v after %v, want %v within the 50ms budget", err, took, errDeadlock)
	}
	if pauses == 0 || pauses > 10 {
		t.Errorf("pauses: got %d, want 1 to 10 (5ms each within 50ms)", pauses)
	}
}
