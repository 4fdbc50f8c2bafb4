package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// sqllock run is stopped (SIGSTOP: a debugger, a VM migration, a host under
// memory pressure) for longer than its lease, alone or with its command,
// while another host takes the name over. When it continues, it finds its
// keep-alive's deadline passed, kills the command's process group and exits
// 124, within the kill grace and a round trip, rather than letting the
// command run on beside the new holder. While sqllock itself is stopped it
// can stop nothing: that is what the fence ($SQLLOCK_FENCE) is for.
func TestRun_pausedPastLease(t *testing.T) {
	for _, whole := range []bool{false, true} {
		what := "sqllock alone"
		if whole {
			what = "sqllock and its command"
		}
		t.Run(strings.ReplaceAll(what, " ", "_"), func(t *testing.T) {
			testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
				e := newEnv(t, s.DSN)
				// A machine loaded enough (two CI runs at once did it) lets
				// the keep-alive lose the lease before the stop: that run
				// proves nothing of a pause, and is made again.
				for attempt := 1; !pausedPastLease(t, e, whole); attempt++ {
					if attempt == 3 {
						t.Fatal("sqllock lost its lease before the stop in 3 runs of 3: the machine is too slow for this test")
					}
				}
			})
		})
	}
}

// pausedTTL is the lease of the paused run: its keep-alive's deadline comes
// at three quarters of it after a renewal.
const pausedTTL = 3 * time.Second

// pausedPastLease runs the scenario once and reports whether it could: false
// when sqllock lost its lease before the stop.
func pausedPastLease(t *testing.T, e *env, whole bool) bool {
	pidFile, beats := e.path("pid"), e.path("beats")
	_ = os.Remove(pidFile)
	_ = os.Remove(beats)
	script := `echo $$ > ` + pidFile + `; while :; do echo beat >> ` + beats + `; sleep 0.02; done`
	cmd := e.command("run", "-v", "--ttl", pausedTTL.String(), "--kill-grace", "300ms", "paused", "--", "sh", "-c", script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, 30*time.Second, "the command to start", func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	stopped := []int{cmd.Process.Pid}
	if whole {
		stopped = append(stopped, -pid)
	}
	signal := func(sig syscall.Signal) {
		for _, p := range stopped {
			// sqllock, continued first, may have killed the command's
			// group already.
			if err := syscall.Kill(p, sig); err != nil && !(sig == syscall.SIGCONT && errors.Is(err, syscall.ESRCH)) {
				t.Errorf("%v to %d: %v", sig, p, err)
			}
		}
	}
	defer func() {
		for _, p := range stopped {
			_ = syscall.Kill(p, syscall.SIGCONT) // nothing stays stopped, whatever failed
		}
		if t.Failed() {
			_ = syscall.Kill(-pid, syscall.SIGKILL) // sqllock did not: do not hang
		}
	}()
	// Stopped just after a renewal, as the server saw it, so that the
	// lease the keep-alive holds is whole: a fixed sleep before the stop
	// let a loaded machine's keep-alive give the lease up on its own first
	// (its deadline fired on time, with no renewal back yet), and the
	// loss then said "may expire", not "may have expired" (a CI run, at
	// a load average of 11).
	other := e.client(sqllock.WithHolder("other-host"))
	renewed := false
	waitFor(t, 20*time.Second, "a renewal of the lease, or its loss", func() bool {
		info, err := other.Inspect(context.Background(), "paused")
		if err != nil {
			t.Fatal(err)
		}
		renewed = info.Held && info.Age > pausedTTL/4 && info.TTL > pausedTTL-pausedTTL/4
		return renewed || !info.Held
	})
	if !renewed {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Logf("sqllock lost its lease before the stop; made again. Its stderr: %s", stderr.String())
		return false
	}
	signal(syscall.SIGSTOP)

	var l *sqllock.Lock
	var err error
	waitFor(t, 20*time.Second, "another client to take the name", func() bool {
		l, err = other.TryAcquire(context.Background(), "paused", time.Minute)
		if err != nil && !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatal(err)
		}
		return err == nil
	})
	signal(syscall.SIGCONT)
	continued := time.Now()
	waitFor(t, 5*time.Second, "sqllock to stop the command after it continued", func() bool {
		return len(liveInGroup(t, pid)) == 0
	})
	t.Logf("the command's process group was gone %v after sqllock continued", time.Since(continued).Round(time.Millisecond))
	_ = cmd.Wait()
	t.Logf("stderr: %s", stderr.String())
	if got := cmd.ProcessState.ExitCode(); got != exitLost {
		t.Errorf("status: got %d, want %d", got, exitLost)
	}
	for _, want := range []string{"was lost while", "may have expired"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	n := len(e.lines("beats"))
	time.Sleep(200 * time.Millisecond)
	if m := len(e.lines("beats")); m != n {
		t.Errorf("heartbeats after sqllock exited: got %d more, want none", m-n)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Errorf("the other client's release: %v", err)
	}
	return true
}
