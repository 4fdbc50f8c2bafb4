package sqllock

import (
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
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
