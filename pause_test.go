//go:build unix

package sqllock

// A holder stopped (SIGSTOP: a debugger, a VM paused, a host under memory
// pressure) past its lease, while another takes the name over, must do no
// unit of work whose context check came after it continued. The holder is
// a child process, this test binary run again as TestPauseChild, which
// prints each unit it does; the parent stops and continues it, and reads.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pauseChildEnv names the child's role; pauseDSNEnv and pauseTableEnv say
// where it works.
const (
	pauseChildEnv = "SQLLOCK_PAUSE_CHILD"
	pauseDSNEnv   = "SQLLOCK_PAUSE_DSN"
	pauseTableEnv = "SQLLOCK_PAUSE_TABLE"
)

// pauseTTL is the child's lease: its keep-alive's deadline comes 200ms
// before it, and a renewal every third of it.
const pauseTTL = 2 * time.Second

// pauseUnit is one unit of work a child did: when it read the clock just
// before its context check, under which lease, and how much lease it
// believed it had left.
type pauseUnit struct {
	check time.Time
	fence uint64
	left  time.Duration
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
	exited chan struct{} // closed when its stdout has closed

	mu     sync.Mutex
	units  []pauseUnit
	lost   []pauseLost
	stderr bytes.Buffer
	bad    []string // lines that did not parse
}

// startPauseChild runs this test binary again as TestPauseChild in role,
// on e's server and table. The test's end kills it, if it still runs.
func startPauseChild(t *testing.T, e *testEnv, table, role string) *pauseChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPauseChild$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), pauseChildEnv+"="+role, pauseDSNEnv+"="+e.dsn, pauseTableEnv+"="+table)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &pauseChild{cmd: cmd, exited: make(chan struct{})}
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
// LEFT" or "pause lost AT LOST CAUSE..." (times in Unix nanoseconds, LEFT
// in ms); anything else (the test binary's PASS) is passed over.
func (c *pauseChild) read(line string) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "pause" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := func(i int) int64 {
		if i >= len(f) {
			return 0
		}
		v, _ := strconv.ParseInt(f[i], 10, 64)
		return v
	}
	switch {
	case f[1] == "unit" && len(f) == 5:
		c.units = append(c.units, pauseUnit{check: time.Unix(0, n(2)), fence: uint64(n(3)), left: time.Duration(n(4)) * time.Millisecond})
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

// stopFresh waits until the child's latest unit saw more than three
// quarters of a pauseTTL lease left (just after an acquire or a renewal),
// then stops it and returns when. It reports false if the child lost its
// lease first: a machine too loaded for the keep-alive to renew in time
// proves nothing of a pause.
func (c *pauseChild) stopFresh(t *testing.T) (time.Time, bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		units, lost, _ := c.snapshot()
		if len(lost) > 0 {
			return time.Time{}, false
		}
		if n := len(units); n > 0 && units[n-1].left > pauseTTL*3/4 {
			stopped := time.Now()
			c.signal(t, syscall.SIGSTOP)
			// Lines written before the stop may still be on their way.
			time.Sleep(50 * time.Millisecond)
			if _, lost, _ := c.snapshot(); len(lost) > 0 {
				return time.Time{}, false
			}
			return stopped, true
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child did no unit with a fresh lease in 30s; its stderr: %s", c.stderrText())
		}
		time.Sleep(time.Millisecond)
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch role {
	case "hold":
		l, err := c.Acquire(ctx, "paused", pauseTTL)
		if err != nil {
			t.Fatal(err)
		}
		work(l.KeepAlive(ctx), l)
		_ = l.Release(ctx)
	default:
		t.Fatalf("unknown role %q", role)
	}
}

// work does units under l until ctx ends, and prints each: the clock read
// just before its context check, the fence, and the lease it believes it
// has left. Then it prints the context's end.
func work(ctx context.Context, l *Lock) {
	for {
		check := time.Now()
		if ctx.Err() != nil {
			cause := context.Cause(ctx)
			fmt.Printf("pause lost %d %t %v\n", time.Now().UnixNano(), errors.Is(cause, ErrLockLost), cause)
			return
		}
		fmt.Printf("pause unit %d %d %d\n", check.UnixNano(), l.Fence(), time.Until(l.ValidUntil()).Milliseconds())
		time.Sleep(5 * time.Millisecond) // the unit's work
	}
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
		for attempt := 1; !stoppedPastLease(t, e, table, other); attempt++ {
			if attempt == 3 {
				t.Fatal("the child lost its lease before the stop in 3 runs of 3: the machine is too slow for this test")
			}
		}
	})
}

// stoppedPastLease runs the scenario once, and reports false when the
// child lost its lease before it was stopped.
func stoppedPastLease(t *testing.T, e *testEnv, table string, other *Client) bool {
	child := startPauseChild(t, e, table, "hold")
	stopped, ok := child.stopFresh(t)
	if !ok {
		t.Log("the child lost its lease before the stop; made again")
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
