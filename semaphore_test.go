package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqllock/sqllock/internal/engine"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// ---------------------------------------------------------------------------
// Counting semaphores: pure logic

func TestSlotName_roundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		slot int
	}{{"jobs", 1}, {"jobs", 64}, {"", 7}, {"a\x00slot", 12}, {"\xff\x00", 9}} {
		s := slotName(tc.name, tc.slot)
		if got, slot := slotOfRow(s); got != tc.name || slot != tc.slot {
			t.Errorf("slotOfRow(slotName(%q, %d)): got %q, %d", tc.name, tc.slot, got, slot)
		}
		if !isSemaphoreRow(s) {
			t.Errorf("isSemaphoreRow(%q): got false, want true", s)
		}
		if p, q := slotRows(tc.name), slotRowsEnd(tc.name); !(p < s && s < q) || !strings.HasPrefix(s, p) {
			t.Errorf("%q: got outside [%q, %q)", s, p, q)
		}
	}
	for _, name := range []string{"jobs", "job\x00", "job\x00slo", "job\x00slot1", "job\x00slotab", "job\x00Slot01", "01"} {
		if isSemaphoreRow(name) {
			t.Errorf("isSemaphoreRow(%q): got true, want false", name)
		}
		if got, slot := slotOfRow(name); got != name || slot != 0 {
			t.Errorf("slotOfRow(%q): got %q, %d, want it unchanged, 0", name, got, slot)
		}
		if err := checkName(name); err != nil {
			t.Errorf("checkName(%q): got %v, want nil", name, err)
		}
	}
	for _, name := range []string{"job\x00slot", "job\x00slot01", "\x00slot99"} {
		if err := checkName(name); err == nil {
			t.Errorf("checkName(%q): got nil, want an error: the name is a semaphore's", name)
		}
	}
}

func TestCheckSlotArgs(t *testing.T) {
	long := strings.Repeat("s", maxSemaphoreNameLen)
	for _, tc := range []struct {
		name string
		n    int
		ttl  time.Duration
		want string // in the error; "" for none
	}{
		{"jobs", 1, time.Second, ""},
		{long, MaxSlots, MaxTTL, ""},
		{"", 3, time.Second, "empty semaphore name"},
		{long + "s", 3, time.Second, "248"},
		{"x\x00slot", 3, time.Second, "mark"},
		{"jobs", 0, time.Second, "at least 1 slot"},
		{"jobs", -1, time.Second, "at least 1 slot"},
		{"jobs", MaxSlots + 1, time.Second, "MaxSlots"},
		{"jobs", 3, 0, "below the minimum"},
		{"jobs", 3, MaxTTL + 1, "beyond the maximum"},
	} {
		err := checkSlotArgs(tc.name, tc.n, tc.ttl)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("checkSlotArgs(%d bytes, %d, %v): got %v, want nil", len(tc.name), tc.n, tc.ttl, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("checkSlotArgs(%d bytes, %d, %v): got %v, want an error saying %q", len(tc.name), tc.n, tc.ttl, err, tc.want)
		}
	}
	if maxSemaphoreNameLen+len(slotMark)+2 != MaxNameLen {
		t.Errorf("a slot's name of the longest semaphore name: got %d bytes, want %d", maxSemaphoreNameLen+len(slotMark)+2, MaxNameLen)
	}
}

// The statement is queries.sql's with its slot row repeated, and the
// arguments match its placeholders for every visit.
func TestSlotSQL_args(t *testing.T) {
	s := &slotCall{acquireCall: acquireCall{c: &Client{holderArg: "h"}, name: slotRows("jobs"), ttl: time.Second, token: "t"}, sem: "jobs", n: 3}
	for _, v := range []int{1, 3, MaxSlots} {
		text := slotSQL("`t1`", false, v)
		if got, want := strings.Count(text, "?"), len(s.args(v)); got != want {
			t.Errorf("v=%d: placeholders %d, args %d", v, got, want)
		}
		if got := strings.Count(text, "'L', IF(LAST_INSERT_ID()"); got != v {
			t.Errorf("v=%d: slot rows: got %d", v, got)
		}
		if !strings.Contains(text, "`t1`") || strings.Contains(text, "`sqllock`") {
			t.Errorf("v=%d: table not in place: %s", v, text)
		}
	}
	if text := slotSQL("`t1`", true, 2); !strings.HasPrefix(text, queries["lock_wait_mariadb"]) {
		t.Errorf("MariaDB's: got %.60q..., want the lock wait bound first", text)
	}
	if got := slotSQL("`t1`", false, 1); got != strings.ReplaceAll(queries["slot_acquire"], "`sqllock`", "`t1`") {
		t.Errorf("v=1: got a statement other than queries.sql's")
	}
}

// Bad arguments are refused before anything is sent: the mock expects
// nothing, and would fail on any statement.
func TestSemaphore_TryAcquire_badInput_sendsNothing(t *testing.T) {
	e := newMockEnv(t)
	for _, tc := range []struct {
		name string
		n    int
		ttl  time.Duration
	}{
		{"", 2, time.Second}, {strings.Repeat("x", maxSemaphoreNameLen+1), 2, time.Second},
		{"jobs", 0, time.Second}, {"jobs", MaxSlots + 1, time.Second}, {"jobs", 2, 0}, {"jobs", 2, -time.Second},
		{"jobs\x00slot", 2, time.Second},
	} {
		if _, err := e.c.Semaphore(tc.name, tc.n).TryAcquire(t.Context(), tc.ttl); err == nil {
			t.Errorf("Semaphore.TryAcquire(%d bytes, %d, %v): got nil, want an error", len(tc.name), tc.n, tc.ttl)
		}
		if _, err := e.c.Semaphore(tc.name, tc.n).Acquire(t.Context(), tc.ttl); err == nil {
			t.Errorf("Semaphore.Acquire(%d bytes, %d, %v): got nil, want an error", len(tc.name), tc.n, tc.ttl)
		}
	}
	if _, err := e.c.Semaphore("", 1).Inspect(t.Context()); err == nil {
		t.Errorf("Inspect of \"\": got nil, want an error")
	}
	e.assertNothingPrepared()
	e.done()
}

// On TiDB, and through Vitess, whose LAST_INSERT_ID() does not carry a value
// between rows, a slot is refused with an error naming the server, after
// the first-use check and before any slot statement.
func TestSemaphore_TryAcquire_oneRowServers_refused(t *testing.T) {
	for _, tc := range []struct {
		version string
		read    int
		want    string
	}{{"8.0.11-TiDB-v8.4.0", 5, "TiDB"}, {"9.7.4-2", 4, "Vitess"}} {
		e := newMockEnv(t)
		e.mock.ExpectQuery(firstUseSQL(e.table)).WithoutArgs().WillReturnRows(firstUseRows(1, tc.version, e.table))
		expectCarries(e.mock, tc.read)
		if tc.want == "Vitess" {
			expectKeyspace(e.mock)
		}
		e.checked = true
		e.tidb, e.vitess = tc.want == "TiDB", tc.want == "Vitess"
		e.expectProof()
		e.mock.ExpectPrepare(e.sql("tidb_release"))
		_, err := e.c.Semaphore("jobs", 2).TryAcquire(t.Context(), time.Second)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "not available") {
			t.Errorf("%s: got %v, want an error naming %s", tc.version, err, tc.want)
		}
		if !errors.Is(err, ErrUnsupportedServer) || !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s: got %v, want an error wrapping ErrUnsupportedServer and errors.ErrUnsupported", tc.version, err)
		}
		e.done()
	}
}

// ---------------------------------------------------------------------------
// Counting semaphores on a real server

// slotServer skips t where there are no semaphores: TiDB and Vitess
// (TestSemaphore_TryAcquire_oneRowServers).
func slotServer(t *testing.T, e *testEnv) {
	t.Helper()
	if e.oneRow() {
		t.Skipf("%s: no semaphores on TiDB and Vitess", e.server.Label)
	}
}

// mustSlot takes a slot or fails the test.
func mustSlot(t *testing.T, c *Client, name string, n int, ttl time.Duration) *Lock {
	t.Helper()
	l, err := c.Semaphore(name, n).TryAcquire(testCtx(t), ttl)
	if err != nil {
		t.Fatalf("Semaphore.TryAcquire(%q, %d): got %v, want nil", name, n, err)
	}
	return l
}

// n holders at most: the slots fill in order, each with a fence above the
// last; the n+1st is refused; a released slot and an expired one are taken
// again; the slot Locks renew, check and release as any Lock; List and
// Inspect show them.
func TestSemaphore_TryAcquire_fillsAndFrees(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		var locks []*Lock
		var last uint64
		// Slot 2's lease is short, to lapse below: no Refresh shortens a
		// lease.
		const short = 3 * time.Second
		var lapse time.Time
		var clients []*Client
		for i := 1; i <= 3; i++ {
			clients = append(clients, e.client(t, e.openDB(t), table, WithHolder("h"+string(rune('0'+i)))))
		}
		other := e.client(t, e.db, table, WithHolder("other"))
		// The checks below run within slot 2's short lease.
		warm(t, append(clients, other)...)
		for i := 1; i <= 3; i++ {
			c := clients[i-1]
			ttl := time.Minute
			if i == 2 {
				ttl = short
			}
			l := mustSlot(t, c, "jobs", 3, ttl)
			if i == 2 {
				lapse = time.Now().Add(short) // after the server's expiry
			}
			if l.Slot() != i || l.Name() != "jobs" {
				t.Fatalf("slot %d: got %q slot %d", i, l.Name(), l.Slot())
			}
			if got := l.Names(); !slices.Equal(got, []string{"jobs"}) {
				t.Fatalf("slot %d: Names: got %q, want [jobs]", i, got)
			}
			if l.Fence() <= last {
				t.Fatalf("fence: got %d, want above %d", l.Fence(), last)
			}
			last = l.Fence()
			locks = append(locks, l)
		}
		if _, err := other.Semaphore("jobs", 3).TryAcquire(ctx, time.Minute); !errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrSlotCount) {
			t.Fatalf("fourth: got %v, want ErrNotAcquired", err)
		}
		// A lock and a semaphore of one name are two things.
		mustAcquire(t, other, "jobs", time.Minute).Release(ctx)

		info, err := other.Semaphore("jobs", 3).Inspect(ctx)
		if err != nil || len(info) != 3 || len(heldSlots(info)) != 3 || info[1].Fence != last || info[1].Slot != 2 || info[1].Holder != "h2" {
			t.Fatalf("Inspect: got %+v, %v", info, err)
		}
		list, err := other.List(ctx)
		if err != nil || len(list) != 3 || list[2].Name != "jobs" || list[2].Slot != 3 || list[0].Fence != last || list[2].Fence != last {
			t.Fatalf("List: got %+v, %v, want the 3 slots, each with the semaphore's fence %d", list, err, last)
		}

		if err := locks[1].Refresh(ctx, 50*time.Millisecond); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if end := time.Now().Add(50 * time.Millisecond); end.After(lapse) {
			lapse = end
		}
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := locks[0].Check(ctx, tx); err != nil {
			t.Fatalf("Check: %v", err)
		}
		_ = tx.Rollback()
		if err := locks[0].Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		l := mustSlot(t, other, "jobs", 3, time.Minute)
		if l.Slot() != 1 || l.Fence() <= last {
			t.Fatalf("after a release: got slot %d fence %d, want slot 1 above %d", l.Slot(), l.Fence(), last)
		}
		last = l.Fence()
		time.Sleep(time.Until(lapse) + 100*time.Millisecond) // slot 2's lease lapses
		l2 := mustSlot(t, other, "jobs", 3, time.Minute)
		if l2.Slot() != 2 || l2.Fence() <= last {
			t.Fatalf("after a lapse: got slot %d fence %d, want slot 2 above %d", l2.Slot(), l2.Fence(), last)
		}
		if err := locks[1].Refresh(ctx, time.Minute); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Refresh of the lapsed slot: got %v, want ErrNotHeld", err)
		}
	})
}

// A call with another n is refused while a slot is held, and resizes the
// semaphore when none is, up or down.
func TestSemaphore_TryAcquire_otherN(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		c := e.newClient(t)
		ctx := testCtx(t)
		l := mustSlot(t, c, "pool", 3, time.Minute)
		for _, n := range []int{1, 2, 4, 64} {
			_, err := c.Semaphore("pool", n).TryAcquire(ctx, time.Minute)
			if !errors.Is(err, ErrSlotCount) || !errors.Is(err, ErrNotAcquired) || !strings.Contains(err.Error(), "has 3 slots") {
				t.Fatalf("n=%d while one of 3 is held: got %v, want ErrSlotCount", n, err)
			}
		}
		if _, err := c.Semaphore("pool", 2).Acquire(ctx, time.Minute); !errors.Is(err, ErrSlotCount) {
			t.Fatalf("Semaphore.Acquire with n=2: got %v, want ErrSlotCount at once", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{5, 2, 1} {
			l := mustSlot(t, c, "pool", n, time.Minute)
			info, err := c.Semaphore("pool", n).Inspect(ctx)
			if err != nil || len(info) != n || len(heldSlots(info)) != 1 {
				t.Fatalf("resized to %d: got %+v, %v", n, info, err)
			}
			if n == 1 {
				if _, err := c.Semaphore("pool", 1).TryAcquire(ctx, time.Minute); !errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrSlotCount) {
					t.Fatalf("second of 1: got %v, want ErrNotAcquired", err)
				}
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Many processes race for 3 slots: never more than 3 hold one at once, no
// two hold one slot, and the fences they get are all different.
func TestSemaphore_TryAcquire_race(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		table := e.newTable(t)
		var clients []*Client
		for range 6 {
			clients = append(clients, e.client(t, e.openDB(t), table))
		}
		raceSlots(t, clients, 3, 15)
	})
}

// raceSlots races Semaphore.TryAcquire of one semaphore of n slots, one goroutine
// per Client making rounds attempts, each holding its slot a millisecond,
// and fails t on more than n holders at once, a slot or a fence given
// twice, or any error but a refusal.
func raceSlots(t *testing.T, clients []*Client, n, rounds int) {
	t.Helper()
	ctx := testCtx(t)
	var (
		live    atomic.Int32
		mu      sync.Mutex
		bySlot  = map[int]bool{}
		fences  = map[uint64]bool{}
		wg      sync.WaitGroup
		taken   atomic.Int32
		errOnce sync.Once
		failed  error
	)
	fail := func(err error) { errOnce.Do(func() { failed = err }) }
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				l, err := c.Semaphore("race", n).TryAcquire(ctx, time.Minute)
				if errors.Is(err, ErrNotAcquired) && !errors.Is(err, ErrSlotCount) {
					continue
				}
				if err != nil {
					fail(err)
					return
				}
				taken.Add(1)
				if live.Add(1) > int32(n) {
					fail(errors.New("more than n holders"))
				}
				mu.Lock()
				if bySlot[l.Slot()] || fences[l.Fence()] {
					fail(errors.New("a slot or a fence given twice"))
				}
				bySlot[l.Slot()], fences[l.Fence()] = true, true
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				bySlot[l.Slot()] = false
				mu.Unlock()
				live.Add(-1)
				if err := l.Release(ctx); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	if taken.Load() < int32(n) {
		t.Fatalf("slots taken: got %d, want at least %d", taken.Load(), n)
	}
	t.Logf("%d slots taken", taken.Load())
}

func isSlotAcquire(q string) bool { return strings.Contains(q, "RIGHT(name, 2)") }

// firstSlotSend makes the first slot_acquire that le's Client sends (not a
// proof's) meet action, and lets every other pass; it returns how many
// were sent so far.
func firstSlotSend(le *lateEnv, action lateAction) (sent func() int) {
	sends := 0
	le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
		if isSlotAcquire(q) && !aboutProof(args) {
			if sends++; sends == 1 {
				return action
			}
		}
		return pass
	})
	return func() int { return sends }
}

// aboutProof reports whether a statement's arguments name a proof's rows
// (internal/engine/later.go): the semaphore statements' proof passes the layers that
// lose the Client's own.
func aboutProof(args []driver.NamedValue) bool {
	for _, a := range args {
		if s, ok := a.Value.(string); ok && strings.HasPrefix(s, engine.ProofPrefix) {
			return true
		}
	}
	return false
}
func isSlotRelease(q string) bool {
	return strings.HasPrefix(q, "DELETE") && strings.Contains(q, "name > ?")
}

// A slot acquire whose every reply is lost may have taken a slot under a
// token nobody holds: the call deletes it at once, and the slot is free.
func TestSemaphore_TryAcquire_lostReply_leavesNothing(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		le := newLateEnv(t, e)
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if isSlotAcquire(q) && !aboutProof(args) {
				return lose
			}
			return pass
		})
		_, err := le.c.Semaphore("lost", 1).TryAcquire(testCtx(t), time.Minute)
		if err == nil {
			t.Fatal("Semaphore.TryAcquire with every reply lost: got nil, want an error")
		}
		if _, err := le.witness.Semaphore("lost", 1).TryAcquire(testCtx(t), time.Minute); err != nil {
			t.Fatalf("the witness: got %v, want the slot: the lost acquire's slot was deleted", err)
		}
		// Every send ran: the DELETE removed what one wrote, which proves
		// nothing of the others, so the token stays remembered (held.go).
		if got := le.c.semOrphans.Count("lost"); got != 1 {
			t.Errorf("tokens remembered: got %d, want 1 (%d sends of unknown outcome)", got, fault.MaxTransientAttempts)
		}
	})
}

// When the DELETE after the lost reply is lost too, the Client remembers the
// token and deletes its slot before its next acquire of the semaphore, or at
// Close: nothing stays held by a token nobody has.
func TestSemaphore_TryAcquire_lostReplyAndCleanup_orphanDeleted(t *testing.T) {
	for _, byClose := range []bool{false, true} {
		eachServerEnv(t, func(t *testing.T, e *testEnv) {
			slotServer(t, e)
			le := newLateEnv(t, e)
			ctx := testCtx(t)
			// The acquire's replies are lost; its DELETE is held back, as
			// if it ran late, and never arrives.
			le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
				switch {
				case aboutProof(args):
				case isSlotAcquire(q):
					return lose
				case isSlotRelease(q):
					return hold
				}
				return pass
			})
			if _, err := le.c.Semaphore("orph", 1).TryAcquire(ctx, time.Minute); err == nil {
				t.Fatal("got nil, want an error")
			}
			if got := le.c.semOrphans.Count("orph"); got != 1 {
				t.Fatalf("tokens remembered: got %d, want 1", got)
			}
			if _, err := le.witness.Semaphore("orph", 1).TryAcquire(ctx, time.Minute); !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("witness while the orphan holds the slot: got %v, want ErrNotAcquired", err)
			}
			le.lc.setDecide(nil)
			le.lc.mu.Lock()
			le.lc.held = nil // the late DELETE never arrives
			le.lc.mu.Unlock()
			if byClose {
				if err := le.c.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if _, err := le.witness.Semaphore("orph", 1).TryAcquire(ctx, time.Minute); err != nil {
					t.Fatalf("witness after Close: got %v, want the slot", err)
				}
				return
			}
			l, err := le.c.Semaphore("orph", 1).TryAcquire(ctx, time.Minute)
			if err != nil || l.Slot() != 1 {
				t.Fatalf("next acquire: got %v, %v, want slot 1 (the orphan deleted first)", l, err)
			}
			// Deleted again until no send of it can commit (held.go).
			if got := le.c.semOrphans.Count("orph"); got != 1 {
				t.Errorf("tokens remembered after: got %d, want 1 (%d sends of unknown outcome)", got, fault.MaxTransientAttempts)
			}
		})
	}
}

// A slot acquire cut by its context while it waits for a row lock is
// settled as a lost reply is: when it runs late, the slot it takes goes
// before the Client's next acquire of the semaphore.
func TestSemaphore_Acquire_ctxEnds_waits(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		c := e.newClient(t, WithRetry(LinearBackoff(5*time.Millisecond)))
		other := e.client(t, e.openDB(t), strings.Trim(c.table, "`"))
		l := mustSlot(t, other, "wait", 1, time.Minute)
		// c's first slot proves its statements first, within the caller's
		// context; the short one below is for the wait alone.
		if err := mustSlot(t, c, "warm", 1, time.Minute).Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		defer cancel()
		_, err := c.Semaphore("wait", 1).Acquire(ctx, time.Minute)
		if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Semaphore.Acquire until ctx ends: got %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		go func() {
			time.Sleep(50 * time.Millisecond)
			_ = l.Release(context.Background())
		}()
		got, err := c.Semaphore("wait", 1).Acquire(testCtx(t), time.Minute)
		if err != nil || got.Slot() != 1 {
			t.Fatalf("Semaphore.Acquire after the release: got %v, %v", got, err)
		}
	})
}

// On TiDB and through Vitess the call is refused by name, and writes
// nothing; elsewhere the test has nothing to show.
func TestSemaphore_TryAcquire_oneRowServers(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if !e.oneRow() {
			t.Skipf("%s carries LAST_INSERT_ID() between rows: semaphores serve there", e.server.Label)
		}
		skipFakeFor(t, e, "the fake is no one-row server")
		c := e.newClient(t)
		_, err := c.Semaphore("jobs", 2).TryAcquire(testCtx(t), time.Minute)
		want := "Vitess"
		if e.server.TiDB {
			want = "TiDB"
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want an error naming %s", err, want)
		}
		// As every refusal of a server (internal/engine/proof.go).
		wantErrIs(t, err, ErrUnsupportedServer)
		wantErrIs(t, err, errors.ErrUnsupported)
		var n int
		if err := e.db.QueryRow("SELECT COUNT(*) FROM " + c.table + " WHERE name LIKE 'jobs%'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("rows of the semaphore: got %d, %v, want 0", n, err)
		}
	})
}

// Lock.Do runs fn under a kept-alive slot, with the slot's Lock, and gives
// the slot back; TryAcquire refuses at once when all are held.
func TestLock_Do_semaphoreSlot(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		c := e.newClient(t)
		ctx := testCtx(t)
		// Renewals every 500 ms, each with 375 ms to answer, 1.35 s before
		// the keep-alive gives up: margins a loaded machine keeps.
		const ttl = 1500 * time.Millisecond
		err := lockDo(c.Semaphore("do", 1).Acquire(ctx, ttl))(ctx, func(ctx context.Context, l *Lock) error {
			if l.Slot() != 1 || l.Fence() == 0 {
				t.Errorf("fn's Lock: got slot %d fence %d", l.Slot(), l.Fence())
			}
			if _, err := c.Semaphore("do", 1).TryAcquire(ctx, time.Second); !errors.Is(err, ErrNotAcquired) {
				t.Errorf("TryAcquire while the one slot is held: got %v, want ErrNotAcquired", err)
			}
			time.Sleep(ttl + 300*time.Millisecond) // past the ttl: the keep-alive renews
			return ctx.Err()
		})
		if err != nil {
			t.Fatalf("Do: got %v, want nil", err)
		}
		if info, err := c.Semaphore("do", 1).Inspect(ctx); err != nil || len(heldSlots(info)) != 0 {
			t.Fatalf("after Do: got %+v, %v, want no slot held", info, err)
		}
	})
}

// A slot taken by a statement sent again after a lost reply may be taken
// again by that first send running late, once the Lock is released: the
// release hands the token to the orphan list, under the semaphore, so the
// Client's next acquire of any of its slots deletes what it took
// (acquire.go, rule 3).
func TestSemaphore_TryAcquire_sentTwice_releaseRemembersToken(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		le := newLateEnv(t, e)
		ctx := testCtx(t)
		sends := firstSlotSend(le, lose)
		l, err := le.c.Semaphore("twice", 2).TryAcquire(ctx, time.Minute)
		if err != nil || l.Slot() != 1 {
			t.Fatalf("got %v, %v, want slot 1", l, err)
		}
		if sends() != 2 {
			t.Fatalf("sends: got %d, want 2", sends())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got := le.c.semOrphans.Count("twice"); got != 1 {
			t.Fatalf("tokens remembered after the release: got %d, want 1", got)
		}
		// The first send runs late now, and takes slot 1 under the token.
		if _, err := le.straight.Exec(slotSQL("`"+le.table+"`", false, 2), func() []any {
			s := &slotCall{acquireCall: acquireCall{c: le.c, name: slotRows("twice"), ttl: time.Minute, token: l.Token()}, sem: "twice", n: 2}
			return s.args(2)
		}()...); err != nil {
			t.Fatal(err)
		}
		l2, err := le.c.Semaphore("twice", 1).TryAcquire(ctx, time.Minute)
		if err != nil || l2.Slot() != 1 {
			t.Fatalf("next acquire, as a semaphore of 1: got %v, %v, want slot 1: the late slot deleted first", l2, err)
		}
	})
}

// slot_release is safe for statement-based replication (no Note 1592 under
// binlog_format=STATEMENT), and slot_acquire is but for its session guard
// (TestQueries_statementBinlogSafe); neither raises any other warning: no
// truncating cast, no deprecated syntax.
func TestSemaphore_TryAcquire_statementBinlogSafe(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		c := e.newClient(t)
		ctx := testCtx(t)
		mustSlot(t, c, "warm", 1, time.Second) // the first use
		conn, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var logBin bool
		if err := conn.QueryRowContext(ctx, "SELECT @@log_bin").Scan(&logBin); err != nil {
			t.Fatal(err)
		}
		if logBin {
			if _, err := conn.ExecContext(ctx, "SET SESSION binlog_format = 'STATEMENT'"); err != nil {
				t.Fatalf("binlog_format: %v", err)
			}
			defer conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION binlog_format = DEFAULT")
		}
		call := func(n int) *slotCall {
			s, err := c.newSlotCall("b", n, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		three, two := call(3), call(2)
		for _, s := range []struct {
			what string
			text string
			args []any
		}{
			{"take", slotSQL(c.eng.Forms().Table, false, 3), three.args(3)},
			{"take again, the same token", slotSQL(c.eng.Forms().Table, false, 3), three.args(3)},
			{"another n, refused", slotSQL(c.eng.Forms().Table, false, 2), two.args(2)},
			{"release", c.eng.Text().Substitute(queries["slot_release"]), []any{slotRows("b"), slotRowsEnd("b"), three.token}},
			{"another n, resized", slotSQL(c.eng.Forms().Table, false, 3), two.args(3)}, // the wider visit of a smaller n
		} {
			if _, err := conn.ExecContext(ctx, s.text, s.args...); err != nil {
				t.Fatalf("%s: %v", s.what, err)
			}
			rows, err := conn.QueryContext(ctx, "SHOW WARNINGS")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var level, msg string
				var code int
				if err := rows.Scan(&level, &code, &msg); err != nil {
					t.Fatal(err)
				}
				if code == 1592 && s.what != "release" && guardUnsafe(msg) {
					continue
				}
				t.Errorf("%s: got %s %d (%s), want no warning", s.what, level, code, msg)
			}
			rows.Close()
		}
		info, err := c.Semaphore("b", 2).Inspect(ctx)
		if err != nil || len(info) != 2 {
			t.Fatalf("after the resize: got %+v, %v, want 2 slots", info, err)
		}
	})
}

// A slot's acquire calls are told to the Observer as every kind's are: each
// call's AcquireDone under the semaphore's name, and each send of the slot
// statement that may be sent again to Retried, as the single acquire's
// sends are.
func TestSemaphore_TryAcquire_observed(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		r := newEventRecorder()
		le := newLateEnv(t, e, WithObserver(r.observer()))
		ctx := testCtx(t)
		l := mustSlot(t, le.c, "jobs", 1, time.Minute)
		if _, err := le.c.Semaphore("jobs", 1).TryAcquire(ctx, time.Minute); !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("the second slot of one: got %v, want ErrNotAcquired", err)
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, err := le.c.Semaphore("jobs", 1).Acquire(short, time.Minute); !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("Semaphore.Acquire while held: got %v, want ErrNotAcquired", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if isSlotAcquire(q) && !aboutProof(args) {
				return lose
			}
			return pass
		})
		if _, err := le.c.Semaphore("lost", 1).TryAcquire(ctx, time.Minute); err == nil {
			t.Fatal("Semaphore.TryAcquire with every reply lost: got nil, want an error")
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		calls := map[string]int{}
		for _, ev := range r.acquires {
			calls[fmt.Sprintf("%s %s", ev.Name, ev.Outcome)]++
			if ev.Attempts < 1 {
				t.Errorf("AcquireEvent %+v: no attempt counted", ev)
			}
		}
		if want := map[string]int{"warm acquired": 1, "jobs acquired": 1, "jobs held": 2, "lost broken": 1}; !maps.Equal(calls, want) {
			t.Errorf("acquire calls told: got %v, want %v", calls, want)
		}
		if got := r.counts["retry slot_acquire lost broken"]; got != fault.MaxTransientAttempts {
			t.Errorf("sends of the lost slot acquire told to Retried: got %d, want %d (%s)", got, fault.MaxTransientAttempts, showCounts(r.counts))
		}
		if got := r.counts["unknown lost settled=false"]; got != 1 {
			t.Errorf("the lost slot acquire's token told to Unknown under the semaphore's name: got %d, want 1 (%s)", got, showCounts(r.counts))
		}
	})
}

// On MariaDB a slot acquire waits at most a second for a slot row that a
// holder's Lock.Check keeps locked, and reports the semaphore held, as a
// single acquire reports its name (queries.sql, lock_wait_mariadb).
func TestSemaphore_TryAcquire_rowLockedByCheck_held(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		if !e.server.MariaDB {
			t.Skip("the bound on a row lock is MariaDB's (lock_wait_mariadb); on MySQL the acquire waits for the transaction")
		}
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		l := mustSlot(t, a, "sem", 1, time.Minute)
		checkedTx(t, a, l)
		short, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := b.Semaphore("sem", 1).TryAcquire(short, time.Minute)
		if !errors.Is(err, ErrNotAcquired) || !strings.Contains(err.Error(), "stayed locked") {
			t.Fatalf("Semaphore.TryAcquire while the holder's Check locks the slot: got %v, want ErrNotAcquired saying the slot stayed locked", err)
		}
	})
}

// heldSlots returns the slots of info that are held.
func heldSlots(info []Info) []Info {
	var held []Info
	for _, i := range info {
		if i.Held {
			held = append(held, i)
		}
	}
	return held
}
