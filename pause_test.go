//go:build unix

package sqllock

// A holder or leader stopped (SIGSTOP: a debugger, a VM paused, a host
// under memory pressure) past its lease, while another takes the name over,
// must do no unit of work whose context check came after it continued; a
// unit checked before the stop and written after it is refused by its
// fence. The holder is a child process, this test binary run again as
// TestPauseChild, which prints each unit it does; the parent stops and
// continues it, and reads.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// pauseChildEnv names the child's role; pauseDSNEnv and pauseTableEnv say
// where it works, pauseTTLEnv for how long a lease.
const (
	pauseChildEnv = "SQLLOCK_PAUSE_CHILD"
	pauseDSNEnv   = "SQLLOCK_PAUSE_DSN"
	pauseTableEnv = "SQLLOCK_PAUSE_TABLE"
	pauseTTLEnv   = "SQLLOCK_PAUSE_TTL"
)

// pauseUnit is one unit of work a child did: when it read the clock just
// before its context check, under which lease, how much lease it believed
// it had left, and, for a leader, how its fenced write went ("ok",
// "refused"; "-" for none) and when its answer came.
type pauseUnit struct {
	check time.Time
	fence uint64
	left  time.Duration
	write string
	wrote time.Time
}

// pauseLost is the child's report that its context ended.
type pauseLost struct {
	at    time.Time
	lost  bool // the cause wraps ErrLockLost
	cause string
}

// A pauseChild is a child process that holds or leads, and what it said.
type pauseChild struct {
	cmd    *exec.Cmd
	ttl    time.Duration
	stdin  io.Closer     // closing it ends the child's work
	exited chan struct{} // closed when its stdout has closed

	mu     sync.Mutex
	units  []pauseUnit
	lost   []pauseLost
	stderr bytes.Buffer
	bad    []string // lines that did not parse
}

// startPauseChild runs this test binary again as TestPauseChild in role,
// on e's server and table, with leases of ttl. The test's end kills it, if
// it still runs.
func startPauseChild(t *testing.T, e *testEnv, table, role string, ttl time.Duration) *pauseChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPauseChild$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), pauseChildEnv+"="+role, pauseDSNEnv+"="+e.dsn, pauseTableEnv+"="+table, pauseTTLEnv+"="+ttl.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &pauseChild{cmd: cmd, ttl: ttl, stdin: in, exited: make(chan struct{})}
	cmd.Stderr = lockedWriter{mu: &c.mu, w: &c.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // nothing stays stopped, whatever failed
		_ = cmd.Process.Kill()
		<-c.exited
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the child's stderr: %s", c.stderrText())
		}
	})
	go func() {
		defer close(c.exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.read(sc.Text())
		}
	}()
	return c
}

func (c *pauseChild) stderrText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// read records one line of the child's stdout: "pause unit CHECK FENCE
// LEFT WRITE WROTE" or "pause lost AT LOST CAUSE..." (times in Unix
// nanoseconds, WROTE 0 for no write, LEFT in ms); anything else (the test
// binary's PASS) is passed over.
func (c *pauseChild) read(line string) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "pause" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := func(i int) int64 {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		return v
	}
	switch {
	case f[1] == "unit" && len(f) == 7:
		fence, _ := strconv.ParseUint(f[3], 10, 64)
		c.units = append(c.units, pauseUnit{check: time.Unix(0, n(2)), fence: fence, left: time.Duration(n(4)) * time.Millisecond,
			write: f[5], wrote: time.Unix(0, n(6))})
	case f[1] == "lost" && len(f) >= 4:
		c.lost = append(c.lost, pauseLost{at: time.Unix(0, n(2)), lost: f[3] == "true", cause: strings.Join(f[4:], " ")})
	default:
		c.bad = append(c.bad, line)
	}
}

// snapshot returns what the child has said so far.
func (c *pauseChild) snapshot() (units []pauseUnit, lost []pauseLost, bad []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]pauseUnit(nil), c.units...), append([]pauseLost(nil), c.lost...), append([]string(nil), c.bad...)
}

// signal sends sig to the child.
func (c *pauseChild) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v to the child: %v", sig, err)
	}
}

// fresh waits until the child's latest unit, under a lease with a fence
// above after, saw more than three quarters of its ttl left (just after an
// acquire or a renewal), and returns that fence and how many losses the
// child had reported by then.
func (c *pauseChild) fresh(t *testing.T, after uint64) (fence uint64, losses int) {
	t.Helper()
	fence, losses, ok := c.freshOrExit(t, after)
	if !ok {
		t.Fatalf("the child exited before a unit with a fresh lease; its stderr: %s", c.stderrText())
	}
	return fence, losses
}

// freshOrExit is fresh, but reports false when the child exits first: a
// holder does, once it has reported its loss, and on a loaded machine
// (load average 20) it lost its first lease before any renewal answered.
func (c *pauseChild) freshOrExit(t *testing.T, after uint64) (fence uint64, losses int, ok bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		units, lost, _ := c.snapshot()
		if n := len(units); n > 0 && units[n-1].fence > after && units[n-1].left > c.ttl*3/4 {
			return units[n-1].fence, len(lost), true
		}
		select {
		case <-c.exited:
			// Every line it wrote has been read: look once more.
			if units, lost, _ := c.snapshot(); len(units) > 0 && units[len(units)-1].fence > after && units[len(units)-1].left > c.ttl*3/4 {
				return units[len(units)-1].fence, len(lost), true
			}
			return 0, 0, false
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child did no unit with a fresh lease in 30s; its stderr: %s", c.stderrText())
		}
		time.Sleep(time.Millisecond)
	}
}

// stopFresh waits for a unit with a fresh lease (see fresh), stops the
// child and returns when, and the lease's fence. It reports false, the
// child continued, if the child lost that lease before the stop: a machine
// too loaded for the keep-alive to renew in time proves nothing of a pause.
func (c *pauseChild) stopFresh(t *testing.T, after uint64) (stopped time.Time, fence uint64, ok bool) {
	t.Helper()
	_, before, _ := c.snapshot()
	fence, losses, ok := c.freshOrExit(t, after)
	if !ok {
		if _, lost, _ := c.snapshot(); len(lost) == len(before) {
			t.Fatalf("the child exited before a unit with a fresh lease, reporting no loss; its stderr: %s", c.stderrText())
		}
		return time.Time{}, 0, false // it lost the lease, and exited
	}
	stopped = time.Now()
	c.signal(t, syscall.SIGSTOP)
	return stopped, fence, c.keptUntilStop(t, losses)
}

// keptUntilStop reports whether the child, now stopped, had reported no
// loss beyond losses when it stopped; if it had, it continues it.
func (c *pauseChild) keptUntilStop(t *testing.T, losses int) bool {
	t.Helper()
	// Lines written before the stop may still be on their way.
	time.Sleep(50 * time.Millisecond)
	if _, lost, _ := c.snapshot(); len(lost) > losses {
		c.signal(t, syscall.SIGCONT)
		return false
	}
	return true
}

// waitStopped waits until the child is stopped (state T in /proc), as after
// it stopped itself.
func (c *pauseChild) waitStopped(t *testing.T) {
	t.Helper()
	stat := fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid)
	waitFor(t, 10*time.Second, "the child to stop itself", func() bool {
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatalf("the child's state: %v", err)
		}
		// pid (comm) state ...; comm may hold spaces.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return len(f) > 0 && f[0] == "T"
	})
}

// waitLost waits until the child has reported more than losses losses.
func (c *pauseChild) waitLost(t *testing.T, losses int) pauseLost {
	t.Helper()
	var lost []pauseLost
	waitFor(t, 20*time.Second, "the child to report its loss", func() bool {
		_, lost, _ = c.snapshot()
		return len(lost) > losses
	})
	return lost[losses]
}

// waitExit waits for the child to exit, at most limit.
func (c *pauseChild) waitExit(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-c.exited:
		_ = c.cmd.Wait()
	case <-time.After(limit):
		t.Fatalf("the child did not exit within %v of continuing", limit)
	}
}

// afterResume returns the units of the lease fence whose context check
// came after resumed.
func afterResume(units []pauseUnit, fence uint64, resumed time.Time) []pauseUnit {
	var late []pauseUnit
	for _, u := range units {
		if u.fence == fence && u.check.After(resumed) {
			late = append(late, u)
		}
	}
	return late
}

// TestPauseChild is the child process of the pause tests: it does nothing
// unless pauseChildEnv names its role.
func TestPauseChild(t *testing.T) {
	role := os.Getenv(pauseChildEnv)
	if role == "" {
		t.Skip("the child process of the pause tests (pause_test.go), run by them")
	}
	db, err := sql.Open("mysql", os.Getenv(pauseDSNEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := New(db, WithTable(os.Getenv(pauseTableEnv)), WithHolder("paused-child"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ttl, err := time.ParseDuration(os.Getenv(pauseTTLEnv))
	if err != nil {
		t.Fatal(err)
	}
	// The parent closes stdin to end the work; ten minutes at the most.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	switch role {
	case "hold":
		l, err := c.Acquire(ctx, "paused", ttl)
		if err != nil {
			t.Fatal(err)
		}
		_ = pauseWork(l.KeepAlive(ctx), l, nil)
		_ = l.Release(ctx)
	case "lead":
		// SIGUSR1: stop after the next unit's context check, before its
		// write, as a pause can.
		stopNext := stopOnUSR1()
		r := &resource{db: db, table: os.Getenv(pauseTableEnv) + "_res", who: "child"}
		base := ctx
		err := c.Elect(ctx, "leader", ttl, Callbacks{OnStartedLeading: func(ctx context.Context, l *Lock) error {
			return pauseWork(ctx, l, func() (bool, error) {
				if stopNext.Swap(false) {
					stopSelf()
				}
				// Not under the lease's context, which would stop the
				// write before it is sent once the lease has ended: as a
				// statement already on its way, or a store that takes no
				// context, only the fence stops it.
				return r.write(base, l.Fence())
			})
		}})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Elect: %v", err)
		}
	case "check-lead":
		frozenChildLead(ctx, t, c, db, ttl) // frozen_test.go
	default:
		t.Fatalf("unknown role %q", role)
	}
}

// stopOnUSR1 returns a flag that each SIGUSR1 sets: a child stops itself
// at the next point its role chooses, when it finds the flag set.
func stopOnUSR1() *atomic.Bool {
	var stopNext atomic.Bool
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			stopNext.Store(true)
		}
	}()
	return &stopNext
}

// stopSelf stops the process and returns once it is continued. The stop is
// the process's: the kernel may stop the other threads before this one,
// which could otherwise send its write meanwhile (it did once in 18 runs).
func stopSelf() {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-cont
}

// pauseWork does units under l until ctx ends, and prints each: the clock read
// just before its context check, the fence, the lease it believes it has
// left, and what write, if not nil, did. Then it prints the context's end,
// and returns nil, or write's error.
func pauseWork(ctx context.Context, l *Lock, write func() (ok bool, err error)) error {
	for {
		check := time.Now()
		if ctx.Err() != nil {
			cause := context.Cause(ctx)
			fmt.Printf("pause lost %d %t %v\n", time.Now().UnixNano(), errors.Is(cause, ErrLockLost), cause)
			return nil
		}
		left := time.Until(l.ValidUntil())
		result, wrote := "-", int64(0)
		if write != nil {
			ok, err := write()
			switch {
			case err != nil && ctx.Err() != nil:
				continue // the write was cut by the lease's end: say so above
			case err != nil:
				return err
			case ok:
				result = "ok"
			default:
				result = "refused"
			}
			wrote = time.Now().UnixNano()
		}
		fmt.Printf("pause unit %d %d %d %s %d\n", check.UnixNano(), l.Fence(), left.Milliseconds(), result, wrote)
		time.Sleep(5 * time.Millisecond) // the rest of the unit's work
	}
}

// A resource is the row a leader's units write, fenced: a write carries
// the writer's fence and is refused when the row holds a higher one.
type resource struct {
	db    *sql.DB
	table string
	who   string
	n     int
}

// createResource creates table's resource table, dropped when the test ends.
func createResource(t *testing.T, e *testEnv, table string) {
	t.Helper()
	name := "`" + table + "_res`"
	e.vindexOn(t, table+"_res", "id") // a sharded Vitess keyspace routes by it
	for _, q := range []string{
		"CREATE TABLE " + name + " (id INT PRIMARY KEY, v VARCHAR(64) NOT NULL, fence BIGINT UNSIGNED NOT NULL)",
		"INSERT INTO " + name + " (id, v, fence) VALUES (1, '', 0)",
	} {
		if _, err := e.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = e.db.Exec("DROP TABLE IF EXISTS " + name) })
}

// write writes the next value with fence, and reports whether the row took
// it. The value changes with every write, so that an accepted write always
// changes the row (affected rows count changed rows).
func (r *resource) write(ctx context.Context, fence uint64) (bool, error) {
	r.n++
	res, err := r.db.ExecContext(ctx, "UPDATE `"+r.table+"` SET v = ?, fence = ? WHERE id = 1 AND fence <= ?",
		fmt.Sprintf("%s-%d", r.who, r.n), fence, fence)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// A holder (Acquire and KeepAlive, a 2s lease) stopped past its lease while
// another client takes the name, then continued, does no unit whose
// context check came after it continued: its context has ended by then,
// saying the lease may have expired.
func TestLock_KeepAlive_stoppedPastLease(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "the holder is another process, which cannot reach this one's fake")
		table := e.newTable(t)
		other := e.client(t, e.db, table, WithHolder("other"))
		// A run whose child lost its lease before the stop proves nothing
		// of a pause: it is made again with the lease doubled.
		for attempt, ttl := 1, 2*time.Second; !stoppedPastLease(t, e, table, other, ttl); attempt, ttl = attempt+1, ttl*2 {
			if attempt == 3 {
				t.Fatal("the child lost its lease before the stop in 3 runs of 3: the machine is too slow for this test")
			}
		}
	})
}

// stoppedPastLease runs the scenario once with leases of ttl, and reports
// false when the child lost its lease before it was stopped.
func stoppedPastLease(t *testing.T, e *testEnv, table string, other *Client, ttl time.Duration) bool {
	child := startPauseChild(t, e, table, "hold", ttl)
	stopped, _, ok := child.stopFresh(t, 0)
	if !ok {
		t.Logf("the child lost its %v lease before the stop; made again", ttl)
		return false
	}
	var l *Lock
	waitFor(t, 20*time.Second, "another client to take the name", func() bool {
		var err error
		l, err = other.TryAcquire(testCtx(t), "paused", time.Minute)
		if err != nil && !errors.Is(err, ErrNotAcquired) {
			t.Fatal(err)
		}
		return err == nil
	})
	defer l.Release(testCtx(t))
	// Well past the child's lease, whatever the machine's load: the server
	// let l in, so the child's ValidUntil has passed.
	time.Sleep(300 * time.Millisecond)
	resumed := time.Now()
	child.signal(t, syscall.SIGCONT)
	child.waitExit(t, 20*time.Second)

	units, lost, bad := child.snapshot()
	if len(bad) > 0 {
		t.Fatalf("lines the test cannot read: %q", bad)
	}
	if len(units) == 0 || !units[0].check.Before(stopped) {
		t.Fatalf("units before the stop: none, want some (%d in all)", len(units))
	}
	fence := units[0].fence
	if late := afterResume(units, fence, resumed); len(late) > 0 {
		t.Errorf("units checked after the child continued: got %d (the first %v after), want 0", len(late), late[0].check.Sub(resumed))
	}
	if len(lost) != 1 || !lost[0].lost || !strings.Contains(lost[0].cause, "may have expired") {
		t.Fatalf("the child's context ended: got %+v, want once, with ErrLockLost saying the lease may have expired", lost)
	}
	t.Logf("stopped for %v, continued %v after another client took the name (fence %d); the child saw its loss %v after it continued",
		resumed.Sub(stopped).Round(time.Millisecond), 300*time.Millisecond, l.Fence(), lost[0].at.Sub(resumed).Round(time.Microsecond))
	if l.Fence() <= fence {
		t.Fatalf("the other client's fence: got %d, want above the child's %d", l.Fence(), fence)
	}
	return true
}

// leadTTL is the lease of the leader tests: short, so that a round takes
// about two seconds, and long enough that a loaded machine's keep-alive
// still renews in time (a round in which it did not is made again).
const leadTTL = time.Second

// A leader (Elect) stopped past its lease while another candidate takes
// the lead and works, then continued, does no unit whose context check came
// after it continued, in each of several rounds (SQLLOCK_PAUSE_ROUNDS,
// 3 by default; docs/guarantees.md gives 20). In a last round the leader
// stops itself between a unit's context check and its write, which it
// sends when continued: the fence from the Lock OnStartedLeading gets makes
// the resource refuse it, the new leader having written a higher one.
func TestClient_Elect_leaderStoppedPastLease(t *testing.T) {
	rounds := pauseRounds(t, 3)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "the leader is another process, which cannot reach this one's fake")
		table := e.newTable(t)
		createResource(t, e, table)
		child := startPauseChild(t, e, table, "lead", leadTTL)
		other := e.client(t, e.db, table, WithHolder("other"))
		r := &resource{db: e.db, table: table + "_res", who: "other"}
		var fence uint64
		late, unfenced, refused, void := 0, 0, 0, 0
		var slowest time.Duration // from a continue to the leader's report of its loss
		for round := 1; round <= rounds+1; round++ {
			res, ok := leaderStopped(t, child, other, r, fence, round == rounds+1)
			if !ok {
				if void++; void > rounds {
					t.Fatalf("the leader lost its lease before the stop in %d rounds: the machine is too slow for this test", void)
				}
				t.Log("the leader lost its lease before the stop; made again")
				round--
				continue
			}
			fence = res.fence
			late += res.late
			unfenced += res.written - res.refused
			refused += res.refused
			slowest = max(slowest, res.sawLoss)
			t.Logf("round %d: stopped for %v; units checked after the leader continued: %d; checked before the stop and written after: %d, %d of them refused by the fence; the leader saw its loss %v after it continued",
				round, res.stoppedFor.Round(time.Millisecond), res.late, res.written, res.refused, res.sawLoss.Round(time.Microsecond))
		}
		t.Logf("%s: %d rounds and one stopped between check and write: %d units checked after the leader continued; %d checked before the stop and written after it, %d refused by the fence, %d taken (sent before the new leader's first write); the loss seen at most %v after a continue; %d rounds made again",
			e.server.Label, rounds, late, refused+unfenced, refused, unfenced, slowest.Round(10*time.Microsecond), void)
		_ = child.stdin.Close()
		child.waitExit(t, 20*time.Second)
	})
}

// pauseRounds returns how many rounds a pause test makes:
// SQLLOCK_PAUSE_ROUNDS, or def when it is unset.
func pauseRounds(t *testing.T, def int) int {
	t.Helper()
	v := os.Getenv("SQLLOCK_PAUSE_ROUNDS")
	if v == "" {
		return def
	}
	rounds, err := strconv.Atoi(v)
	if err != nil || rounds < 0 {
		t.Fatalf("SQLLOCK_PAUSE_ROUNDS=%q: want a count", v)
	}
	return rounds
}

// A leaderRound is what one round of TestClient_Elect_leaderStoppedPastLease saw.
type leaderRound struct {
	fence      uint64        // of the lead stopped
	late       int           // its units checked after it continued
	written    int           // its units checked before the stop and written after it continued
	refused    int           // of those, the ones the fence refused
	stoppedFor time.Duration // from the stop to the continue
	sawLoss    time.Duration // from the continue to the leader's report of its loss
}

// leaderStopped stops the child while it leads with a lease fresher than
// a fence above after (selfStop: it stops itself after a unit's context
// check, before the write), lets other lead and write to r until it has
// written once, continues the child, waits for it to report its loss, and
// ends other's lead. It reports false, the child continued, if the child
// lost its lead before the stop.
func leaderStopped(t *testing.T, child *pauseChild, other *Client, r *resource, after uint64, selfStop bool) (leaderRound, bool) {
	t.Helper()
	var (
		stopped time.Time
		fence   uint64
		losses  int
		ok      bool
	)
	if selfStop {
		fence, losses = child.fresh(t, after)
		child.signal(t, syscall.SIGUSR1)
		child.waitStopped(t)
		stopped, ok = time.Now(), child.keptUntilStop(t, losses)
	} else {
		_, lost, _ := child.snapshot()
		losses = len(lost)
		stopped, fence, ok = child.stopFresh(t, after)
	}
	if !ok {
		return leaderRound{}, false
	}

	ctx, cancel := context.WithCancel(testCtx(t))
	var (
		mu         sync.Mutex
		otherFence uint64
		writes     int
	)
	elected := make(chan error, 1)
	go func() {
		elected <- other.Elect(ctx, "leader", leadTTL, Callbacks{OnStartedLeading: func(ctx context.Context, l *Lock) error {
			for ctx.Err() == nil {
				ok, err := r.write(ctx, l.Fence())
				if err != nil && ctx.Err() == nil {
					return err
				}
				mu.Lock()
				if ok {
					otherFence, writes = l.Fence(), writes+1
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		}})
	}()
	waitFor(t, 20*time.Second, "the other candidate to lead and write", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return writes > 0
	})
	resumed := time.Now()
	child.signal(t, syscall.SIGCONT)
	lost := child.waitLost(t, losses)
	cancel()
	if err := <-elected; !errors.Is(err, context.Canceled) {
		t.Fatalf("the other candidate's Elect: got %v, want context.Canceled", err)
	}
	if !lost.lost {
		t.Fatalf("the leader's loss: got %q, want ErrLockLost", lost.cause)
	}
	if otherFence <= fence {
		t.Fatalf("the other leader's fence: got %d, want above the stopped leader's %d", otherFence, fence)
	}

	units, _, bad := child.snapshot()
	if len(bad) > 0 {
		t.Fatalf("lines the test cannot read: %q", bad)
	}
	res := leaderRound{fence: fence, late: len(afterResume(units, fence, resumed)), stoppedFor: resumed.Sub(stopped), sawLoss: lost.at.Sub(resumed)}
	for _, u := range units {
		if u.fence == fence && u.check.Before(stopped) && u.wrote.After(resumed) {
			res.written++
			if u.write == "refused" {
				res.refused++
			}
		}
	}
	if res.late > 0 {
		t.Errorf("units of the stopped lead (fence %d) checked after it continued: got %d, want 0", fence, res.late)
	}
	if selfStop && (res.written != 1 || res.refused != 1) {
		t.Errorf("units checked before the leader stopped itself and written after it continued: got %d, %d of them refused; want 1, refused", res.written, res.refused)
	}
	return res, true
}
