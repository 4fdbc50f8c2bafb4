package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command's name in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// A syncBuffer is a bytes.Buffer a command writes while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// readPid waits for a pid written to file.
func readPid(t *testing.T, file string) int {
	t.Helper()
	var pid int
	waitFor(t, 10*time.Second, "a pid in "+file, func() bool {
		b, _ := os.ReadFile(file)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	return pid
}

// kill -9 of sqllock run ends what the command started too, not only the
// command: a script's child (here sleep 60) does not run on, orphaned,
// while another host takes the name. The watchdog does it, within a
// second or two.
func TestRun_grandchildDiesWithSqllock(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if _, err := os.Stat("/proc/self/stat"); err != nil {
			t.Skip("reads processes' state in /proc")
		}
		e := newEnv(t, s.DSN)
		cmd := e.command("run", "-v", "tree", "--", "sh", "-c",
			"echo $$ > "+e.path("pid")+"; sleep 60 & echo $! > "+e.path("grandchild")+"; wait")
		var stderr syncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid, grandchild := readPid(t, e.path("pid")), readPid(t, e.path("grandchild"))
		t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
		if !alive(grandchild) {
			t.Fatalf("the grandchild %d is not running before the kill", grandchild)
		}
		// sqllock names the command's group to the watchdog once the
		// command has started, and then says it runs: a kill before that
		// is the one moment the watchdog misses (watchdog.go), which a
		// loaded machine stretched past the command's first writes.
		waitFor(t, 30*time.Second, "sqllock to say the command runs", func() bool { return strings.Contains(stderr.String(), "running") })
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		t.Logf("sqllock: %v; stderr:\n%s", err, stderr.String())
		killed := time.Now()
		// The watchdog polls its parent every few hundred milliseconds: 2 s
		// was not enough beside other packages' tests on a loaded
		// machine. How long it took is logged.
		waitFor(t, 10*time.Second, "the grandchild to die with sqllock", func() bool { return !alive(grandchild) && !alive(pid) })
		t.Logf("the command's tree was gone %v after sqllock was killed", time.Since(killed).Round(time.Millisecond))
	})
}

// Told "done", the watchdog exits and kills nothing; not told, it kills
// the group when sqllock's end of its pipe closes.
func TestWatchdog_disarmed(t *testing.T) {
	t.Setenv(asCommandEnv, "1") // the test binary, run again, is sqllock
	child := startSleeper(t)
	dog, err := startWatchdog()
	if err != nil {
		t.Fatal(err)
	}
	dog.watch(child)
	dog.disarm()
	if !dog.proc.ProcessState.Success() {
		t.Errorf("watchdog: got %v, want exit 0", dog.proc.ProcessState)
	}
	time.Sleep(100 * time.Millisecond)
	if !alive(child) {
		t.Fatal("a disarmed watchdog killed the group")
	}
	// Not told, it kills the group when its pipe closes.
	dog, err = startWatchdog()
	if err != nil {
		t.Fatal(err)
	}
	dog.watch(child)
	dog.w.Close()
	_ = dog.proc.Wait()
	waitFor(t, 5*time.Second, "the group to be killed", func() bool { return !alive(child) })
}

// startSleeper starts sleep 60 in a process group of its own, reaped in
// the background, and returns its pid.
func startSleeper(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) })
	go p.Wait()
	return p.Pid
}
