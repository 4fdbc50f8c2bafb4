package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/faultproxy"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// The test binary stands in for the command: with asCommandEnv set it runs
// main's code instead of the tests, so every test runs sqllock as separate,
// real processes, as cron does.
const asCommandEnv = "SQLLOCK_TEST_AS_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(asCommandEnv) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	testdsn.QuietDriver() // not the command's, whose stderr the tests read (TestCommands_silentServer)
	// One test at a time, each on every server at once: side by side,
	// TestRun_pausedPastLease's command did not start within 30 s and
	// TestRun_grandchildDiesWithSqllock's tree outlived sqllock by 10 s,
	// on a quiet machine, though each passes alone; the cause is not
	// found yet (bench/testing-history.md, Under load).
	testdsn.Serial = true
	testdsn.Parallel()
	os.Exit(m.Run())
}

// env is one test's server, table and scratch folder.
type env struct {
	t     *testing.T
	dsn   string
	table string
	dir   string
	db    *sql.DB
}

// newEnv makes a fresh lock table on the server at dsn with the create-table
// command; it is dropped when the test ends.
func newEnv(t *testing.T, dsn string) *env {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &env{t: t, dsn: dsn, table: "cmd_" + hex.EncodeToString(b[:]), dir: t.TempDir()}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	e.db = db
	t.Cleanup(func() {
		if _, err := db.Exec("DROP TABLE IF EXISTS `" + e.table + "`"); err != nil {
			t.Errorf("drop %s: %v", e.table, err)
		}
		db.Close()
	})
	if r := e.run("create-table"); r.status != 0 {
		t.Fatalf("create-table: status %d, stderr %q", r.status, r.stderr)
	}
	return e
}

// command returns sqllock with args on the env's table and server.
func (e *env) command(args ...string) *exec.Cmd {
	if len(args) > 0 {
		args = append([]string{args[0], "--table", e.table}, args[1:]...)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asCommandEnv+"=1", "SQLLOCK_DSN="+e.dsn)
	// A command that outlived sqllock would hold its output open: do not
	// hang on it, fail.
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

type result struct {
	status         int
	stdout, stderr string
}

// start starts sqllock with args; wait collects its result.
func (e *env) start(args ...string) (*exec.Cmd, func() result) {
	e.t.Helper()
	cmd := e.command(args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	return cmd, func() result {
		err := cmd.Wait()
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			e.t.Fatalf("sqllock %q: %v", args, err)
		}
		r := result{status: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
		e.t.Logf("sqllock %s: status %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.status, r.stdout, r.stderr)
		return r
	}
}

func (e *env) run(args ...string) result {
	e.t.Helper()
	_, wait := e.start(args...)
	return wait()
}

// client returns a library Client on the env's table.
func (e *env) client(opts ...sqllock.Option) *sqllock.Client {
	e.t.Helper()
	c, err := sqllock.New(e.db, append([]sqllock.Option{sqllock.WithTable(e.table)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

func (e *env) inspect(name string) sqllock.Info {
	e.t.Helper()
	info, err := e.client().Inspect(context.Background(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

func (e *env) path(name string) string { return filepath.Join(e.dir, name) }

func (e *env) lines(name string) []string {
	e.t.Helper()
	b, err := os.ReadFile(e.path(name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Cron fires on two hosts at once, and on a third a second later: with
// --min-hold the short job runs once, and the others exit 75 saying who
// holds the name, or whose ended run its minimum hold keeps it for.
func TestRun_cronHostsFireTogether(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		job := []string{"run", "--min-hold", "10s", "nightly", "--", "sh", "-c", "echo ran >> " + e.path("runs")}
		_, waitA := e.start(job...)
		_, waitB := e.start(job...)
		a, b := waitA(), waitB()
		time.Sleep(time.Second)
		c := e.run(job...)
		statuses := []int{a.status, b.status, c.status}
		ok, conflicts := 0, 0
		for _, r := range []result{a, b, c} {
			switch r.status {
			case 0:
				ok++
			case exitConflict:
				conflicts++
				// The short job may have ended: its minimum hold keeps it.
				if !strings.Contains(r.stderr, "nightly is held by") && !strings.Contains(r.stderr, " and ended; its minimum hold keeps the name taken for ") {
					t.Errorf("conflict message: got %q, want it to name the holder", r.stderr)
				}
			}
		}
		if ok != 1 || conflicts != 2 {
			t.Fatalf("statuses: got %v, want one 0 and two %d", statuses, exitConflict)
		}
		if got := e.lines("runs"); len(got) != 1 {
			t.Fatalf("the job ran %d times, want once", len(got))
		}
	})
}

// A name kept by --min-hold after its run ended is shown as such, not as
// held by the process that has exited: by run's refusal, and by inspect,
// whose JSON says min_hold.
func TestRun_minHoldShownAsEnded(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		if r := e.run("run", "--min-hold", "10m", "nightly", "--", "true"); r.status != 0 {
			t.Fatalf("the first run: got status %d, want 0", r.status)
		}
		info := e.inspect("nightly")
		fence := strconv.FormatUint(info.Fence, 10)
		if !info.Held || !info.MinHold {
			t.Fatalf("Inspect after the run: got %+v, want held, by the minimum hold", info)
		}
		r := e.run("run", "nightly", "--", "true")
		want := regexp.MustCompile(`^sqllock: nightly ran on ` + regexp.QuoteMeta(info.Holder) + ` and ended; its minimum hold keeps the name taken for 9m[0-5]\d(\.\d)?s more \(fence ` + fence + `\); not running true\n$`)
		if r.status != exitConflict || !want.MatchString(r.stderr) {
			t.Errorf("run while the minimum hold lasts: got %d, %q, want %d and %q", r.status, r.stderr, exitConflict, want)
		}
		r = e.run("inspect", "nightly")
		want = regexp.MustCompile(`^nightly: released by ` + regexp.QuoteMeta(info.Holder) + `, whose run has ended; its minimum hold keeps the name taken, fence ` + fence + `: free in 9m[0-5]\d(\.\d)?s\n$`)
		if r.status != 0 || !want.MatchString(r.stdout) {
			t.Errorf("inspect: got %d, %q, want 0 and %q", r.status, r.stdout, want)
		}
		var got lease
		e.runJSON(&got, "inspect", "--json", "nightly")
		if !got.MinHold || !got.Held || got.Holder != info.Holder {
			t.Errorf("inspect --json: got %+v, want held by %s with min_hold", got, info.Holder)
		}
		// A live holder is not shown as ended.
		l, err := e.client(sqllock.WithHolder("live-host:1")).TryAcquire(context.Background(), "live", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
		if r := e.run("run", "live", "--", "true"); r.status != exitConflict || !strings.HasPrefix(r.stderr, "sqllock: live is held by live-host:1 (fence ") {
			t.Errorf("run while another holds the name: got %d, %q, want %d, held by live-host:1", r.status, r.stderr, exitConflict)
		}
	})
}

// --wait waits for the holder to finish, up to its limit; -v says it
// waited only when it did.
func TestRun_wait(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		for _, args := range [][]string{{"run", "-v", "job", "--", "true"}, {"run", "-v", "--wait", "30s", "job", "--", "true"}} {
			r := e.run(args...)
			if r.status != 0 || !strings.Contains(r.stderr, "acquired job (fence ") || strings.Contains(r.stderr, "after waiting") {
				t.Errorf("%s with the name free: got %d, %q, want 0 and the acquire, without a wait", strings.Join(args, " "), r.status, r.stderr)
			}
		}
		// The hold outlasts the short run and the waiting run's start and
		// first use: under CI's load 3 s ended before its first attempt,
		// which then did not wait.
		_, waitA := e.start("run", "job", "--", "sh", "-c", "sleep 10; echo a >> "+e.path("order"))
		waitFor(t, 10*time.Second, "the first run to hold the name", func() bool { return e.inspect("job").Held })

		short := e.run("run", "--wait", "200ms", "job", "--", "sh", "-c", "echo short >> "+e.path("order"))
		if short.status != exitConflict || !strings.Contains(short.stderr, "after waiting") {
			t.Errorf("--wait 200ms: got status %d, %q, want %d after waiting", short.status, short.stderr, exitConflict)
		}
		b := e.run("run", "-v", "--wait", "30s", "job", "--", "sh", "-c", "echo b >> "+e.path("order"))
		if a := waitA(); a.status != 0 || b.status != 0 {
			t.Fatalf("statuses: got %d and %d, want 0 and 0", a.status, b.status)
		}
		if got := strings.Join(e.lines("order"), " "); got != "a b" {
			t.Fatalf("order of runs: got %q, want \"a b\"", got)
		}
		if !strings.Contains(b.stderr, "acquired job after waiting") || !strings.Contains(b.stderr, "released job") {
			t.Errorf("-v: got %q, want the acquire and the release", b.stderr)
		}
	})
}

// The command's own status comes back, 128+N for a signal; sqllock's own
// failures have statuses of their own.
func TestRun_exitStatus(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		notExec := e.path("not-executable")
		if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name string
			args []string
			want int
		}{
			{"exit 0", []string{"run", "s", "--", "true"}, 0},
			{"exit 3", []string{"run", "s", "--", "sh", "-c", "exit 3"}, 3},
			{"killed by SIGTERM", []string{"run", "s", "--", "sh", "-c", "kill -TERM $$"}, 128 + 15},
			{"killed by SIGKILL", []string{"run", "s", "--", "sh", "-c", "kill -KILL $$"}, 128 + 9},
			{"no -- before the command", []string{"run", "s", "sh", "-c", "exit 4"}, 4},
			{"not found", []string{"run", "s", "--", "no-such-command-here"}, exitNotFound},
			{"not executable", []string{"run", "s", "--", notExec}, exitNoExec},
			{"unknown flag", []string{"run", "--no-such-flag", "s", "--", "true"}, exitUsage},
			{"no command", []string{"run", "s"}, exitUsage},
			{"kill grace beyond the ttl", []string{"run", "--ttl", "2s", "--kill-grace", "1s", "s", "--", "true"}, exitUsage},
			{"conflict exit code out of range", []string{"run", "--conflict-exit-code", "300", "s", "--", "true"}, exitUsage},
			{"bad table", []string{"run", "--table", "no-such-table!", "s", "--", "true"}, exitUsage},
			{"missing table", []string{"run", "--table", "no_such_table_" + e.table, "s", "--", "true"}, exitOwn},
			{"unknown command", []string{"frobnicate"}, exitUsage},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if r := e.run(tt.args...); r.status != tt.want {
					t.Fatalf("status: got %d, want %d (stderr %q)", r.status, tt.want, r.stderr)
				}
			})
		}
		t.Run("help", func(t *testing.T) {
			for _, cmd := range []string{"run", "list"} {
				r := e.run(cmd, "-h")
				if r.status != 0 || !strings.Contains(r.stderr, "-dsn") || strings.Contains(r.stderr, e.dsn) {
					t.Errorf("%s -h: got %d, %q, want 0 and the flags without the DSN in use", cmd, r.status, r.stderr)
				}
			}
		})
		t.Run("no server", func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "run", "s", "--", "true")
			cmd.Env = append(os.Environ(), asCommandEnv+"=1", "SQLLOCK_DSN=")
			err := cmd.Run()
			if got := cmd.ProcessState.ExitCode(); got != exitUsage {
				t.Fatalf("status: got %d (%v), want %d", got, err, exitUsage)
			}
		})
		t.Run("conflict exit code", func(t *testing.T) {
			l, err := e.client().TryAcquire(context.Background(), "held", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background())
			if r := e.run("run", "--conflict-exit-code", "0", "held", "--", "false"); r.status != 0 {
				t.Fatalf("status: got %d, want 0", r.status)
			}
		})
	})
}

// The command gets the lease in its environment.
func TestRun_environment(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		r := e.run("run", "envjob", "--", "sh", "-c", `printf '%s %s %s\n' "$SQLLOCK_NAME" "$SQLLOCK_FENCE" "$SQLLOCK_HOLDER"`)
		if r.status != 0 {
			t.Fatalf("status %d", r.status)
		}
		got := strings.Fields(r.stdout)
		info := e.inspect("envjob")
		if len(got) != 3 || got[0] != "envjob" || got[1] != strconv.FormatUint(info.Fence, 10) || !strings.Contains(got[2], ":") {
			t.Fatalf("got %q, want name envjob, fence %d and a host:pid holder", got, info.Fence)
		}
	})
}

// SIGTERM, SIGINT and SIGHUP reach the command, and the lease is released
// once it has exited; a signal while waiting stops sqllock without running
// the command.
func TestRun_signals(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
			t.Run(sig.String(), func(t *testing.T) {
				pidFile := e.path("pid-" + strconv.Itoa(int(sig)))
				script := `trap 'echo got >> ` + e.path("got") + `; exit 7' ` + strings.TrimPrefix(unixName(sig), "SIG") +
					`; echo $$ > ` + pidFile + `; while :; do sleep 0.05; done`
				cmd, wait := e.start("run", "sig", "--", "sh", "-c", script)
				waitFor(t, 10*time.Second, "the command to start", func() bool { _, err := os.Stat(pidFile); return err == nil })
				time.Sleep(100 * time.Millisecond) // past the trap
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				if r := wait(); r.status != 7 {
					t.Fatalf("status: got %d, want the command's 7", r.status)
				}
				if info := e.inspect("sig"); info.Held {
					t.Fatalf("after exit: got %+v, want the lease released", info)
				}
			})
		}
		t.Run("while waiting", func(t *testing.T) {
			l, err := e.client().TryAcquire(context.Background(), "busy", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background())
			cmd := e.command("run", "-v", "--wait", "1m", "busy", "--", "sh", "-c", "echo ran >> "+e.path("busy"))
			stderr, err := os.Create(e.path("stderr"))
			if err != nil {
				t.Fatal(err)
			}
			defer stderr.Close()
			cmd.Stderr = stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "sqllock to wait", func() bool {
				b, _ := os.ReadFile(e.path("stderr"))
				return strings.Contains(string(b), "waiting up to")
			})
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if got := cmd.ProcessState.ExitCode(); got != 128+int(syscall.SIGINT) {
				t.Fatalf("status: got %d, want %d", got, 128+int(syscall.SIGINT))
			}
			if got := e.lines("busy"); len(got) != 0 {
				t.Fatalf("the command ran: %q", got)
			}
		})
	})
}

// liveInGroup lists the processes of group pgid that are not zombies: a
// killed grandchild stays a zombie where init does not reap.
func liveInGroup(t *testing.T, pgid int) []int {
	t.Helper()
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return nil
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil || len(stats) == 0 {
		t.Fatalf("process group %d still has members and /proc cannot say whether they are zombies (%v)", pgid, err)
	}
	var live []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) < 3 || fields[0] == "Z" || fields[2] != strconv.Itoa(pgid) {
			continue
		}
		pid, _ := strconv.Atoi(strings.Fields(string(b))[0])
		live = append(live, pid)
	}
	return live
}

func unixName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGINT:
		return "INT"
	}
	return "HUP"
}

// When the renewals stall (a partition between sqllock and the server), the
// command is killed, SIGKILL included for a command that ignores SIGTERM,
// before anyone else can take the name: at the moment another client's
// acquire succeeds, the command's process group is gone and its heartbeat
// has stopped. sqllock then exits 124 and says why.
func TestRun_leaseLostKillsCommand(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		cfg, err := mysql.ParseDSN(e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		p := startStallProxy(t, cfg.Addr)
		cfg.Addr = p.Addr()
		pidFile, beats := e.path("pid"), e.path("beats")
		// SIGTERM is ignored by the shell and, inherited, by its sleep.
		script := `trap '' TERM; echo $$ > ` + pidFile + `; while :; do echo beat >> ` + beats + `; sleep 0.02; done`
		cmd := e.command("run", "-v", "--ttl", "3s", "--kill-grace", "500ms", "lost", "--", "sh", "-c", script)
		cmd.Env = append(cmd.Env, "SQLLOCK_DSN="+cfg.FormatDSN())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var pid int
		waitFor(t, 10*time.Second, "the command to start", func() bool {
			b, _ := os.ReadFile(pidFile)
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			return pid > 0
		})
		time.Sleep(1500 * time.Millisecond) // a renewal or two
		p.Stall(faultproxy.Both)

		other := e.client(sqllock.WithHolder("other-host"))
		var l *sqllock.Lock
		waitFor(t, 20*time.Second, "another client to take the name", func() bool {
			l, err = other.TryAcquire(context.Background(), "lost", time.Minute)
			if err != nil && !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatal(err)
			}
			return err == nil
		})
		// The moment another holder has the name, nothing of the command runs.
		if live := liveInGroup(t, pid); len(live) > 0 {
			t.Errorf("process group %d when another client took the name: got live processes %v, want none", pid, live)
		}
		n := len(e.lines("beats"))
		time.Sleep(300 * time.Millisecond)
		if m := len(e.lines("beats")); m != n {
			t.Errorf("heartbeats after the takeover: got %d more, want none", m-n)
		}
		if t.Failed() {
			_ = syscall.Kill(-pid, syscall.SIGKILL) // sqllock did not: do not hang
		}
		p.Stall(0)
		_ = cmd.Wait()
		t.Logf("stderr: %s", stderr.String())
		if got := cmd.ProcessState.ExitCode(); got != exitLost {
			t.Errorf("status: got %d, want %d", got, exitLost)
		}
		for _, want := range []string{"SIGTERM", "SIGKILL", "was lost while"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("stderr lacks %q", want)
			}
		}
		if err := l.Release(context.Background()); err != nil {
			t.Errorf("the other client's release: %v", err)
		}
	})
}

// An operator's release --force takes the lease from a running command: its
// next renewal finds the lease gone, and sqllock stops it, exits 124 and
// says that a forced release took it, with the lock-delay left, or that the
// name is free; for a semaphore's slot too.
func TestRun_forceReleaseStopsCommand(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		tests := []struct {
			name    string
			slots   bool // run -n 2, release --force --slot 1
			release []string
			want    string
		}{
			{"lock-delay", false, []string{"--lock-delay", "5m"}, "; the lock-delay keeps evicted from everyone for "},
			{"no lock-delay", false, []string{"--lock-delay=0"}, "; with no lock-delay (--lock-delay=0): evicted is free\n"},
			{"slot", true, []string{"--lock-delay", "5m", "--slot", "1"}, "; the lock-delay keeps evicted slot 1 from everyone for "},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if tt.slots && (s.TiDB || s.Vitess) {
					t.Skip("no semaphores on TiDB and Vitess")
				}
				name := "evicted"
				if tt.slots {
					name = "evicted slot 1"
				}
				// Free the name for the next case, or the next try.
				free := func() {
					e.run("release", "--force", "--lock-delay=0", "evicted")
					e.run("release", "--force", "--lock-delay=0", "--slot", "1", "evicted")
				}
				defer free()
				// At a load average of 20 a 3 s lease was lost before the
				// forced release, for no renewal answered in time, which
				// sqllock rightly reports: a try so broken is made again
				// with the ttl doubled; any other outcome fails.
				var r result
				for ttl := 3 * time.Second; ; ttl *= 2 {
					run := []string{"run", "--ttl", ttl.String(), "--kill-grace", "200ms"}
					if tt.slots {
						run = append(run, "-n", "2")
					}
					pidFile := e.path("pid" + strconv.Itoa(i) + "-" + ttl.String())
					_, wait := e.start(append(run, "evicted", "--", "sh", "-c", "echo $$ > "+pidFile+"; while :; do sleep 0.05; done")...)
					done := make(chan result, 1)
					go func() { done <- wait() }()
					var early *result // the run's, when it ended before the command started
					waitFor(t, 30*time.Second, "the command to start, or sqllock to exit", func() bool {
						if _, err := os.Stat(pidFile); err == nil {
							return true
						}
						select {
						case r := <-done:
							early = &r
							return true
						default:
							return false
						}
					})
					if early == nil {
						rel := e.run(append([]string{"release", "--force", "evicted"}, tt.release...)...)
						if rel.status == 0 && strings.Contains(rel.stdout, "released the lease of") {
							// The keep-alive's deadline may still come
							// before the renewal that finds the lease gone
							// has answered: a loss all the same, said so.
							if r = <-done; !lostUnderLoad(r) || ttl >= 12*time.Second {
								break
							}
							t.Logf("the %v lease was given up for no renewal in time before its renewal found it released; made again with a longer one", ttl)
							free()
							continue
						}
						if rel.status != 0 || !strings.Contains(rel.stdout, "no lease to release") {
							t.Fatalf("release --force: got %d, %q", rel.status, rel.stdout)
						}
						r = <-done
						early = &r
					}
					if !lostUnderLoad(*early) || ttl >= 12*time.Second {
						t.Fatalf("sqllock run ended before the forced release took its lease: status %d, %q", early.status, early.stderr)
					}
					t.Logf("the %v lease was lost under load before the forced release; made again with a longer one", ttl)
					free()
				}
				want := "sqllock: the lease on " + name + " was taken by a forced release (sqllock release --force) while sh -c "
				if r.status != exitLost || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, " ran; killed it"+tt.want) ||
					!strings.HasSuffix(r.stderr, "s more\n") && !strings.HasSuffix(r.stderr, " is free\n") || strings.Count(r.stderr, "\n") != 1 {
					t.Errorf("got status %d, %q, want %d and one line %q...%q", r.status, r.stderr, exitLost, want, tt.want)
				}
				if strings.Contains(r.stderr, "expired") {
					t.Errorf("got %q, which says the lease expired", r.stderr)
				}
			})
		}
	})
}

// lostUnderLoad reports whether sqllock run's result says it lost its lease
// for want of a renewal in time (a machine too loaded for the lease), not,
// or not yet, to a takeover or a forced release.
func lostUnderLoad(r result) bool {
	// 125 when the lease was lost before the command started.
	return (r.status == exitLost && strings.Contains(r.stderr, " was lost while ") || r.status == exitOwn) &&
		strings.Contains(r.stderr, "lock lost: no renewal of")
}

// A command does not outlive a sqllock that was killed (the OOM killer,
// kill -9): nothing would renew its lease.
func TestRun_commandDiesWithSqllock(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if _, err := os.Stat("/proc/self/stat"); err != nil {
			t.Skip("needs Linux's parent-death signal and /proc")
		}
		e := newEnv(t, s.DSN)
		pidFile := e.path("pid")
		cmd, wait := e.start("run", "orphan", "--", "sh", "-c", "echo $$ > "+pidFile+"; while :; do sleep 0.05; done")
		var pid int
		waitFor(t, 10*time.Second, "the command to start", func() bool {
			b, _ := os.ReadFile(pidFile)
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			return pid > 0
		})
		t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		wait()
		waitFor(t, 5*time.Second, "the command to die with sqllock", func() bool {
			return !slices.Contains(liveInGroup(t, pid), pid)
		})
	})
}

// What the command leaves running in its process group ("job &") is stopped
// once the command exits, before the lease is released: SIGTERM, and SIGKILL
// after --kill-grace for what ignores SIGTERM. While it is being stopped the
// name is still held.
func TestRun_leftoversStopped(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if _, err := os.Stat("/proc/self/stat"); err != nil {
			t.Skip("needs /proc to tell a live process from a zombie")
		}
		e := newEnv(t, s.DSN)
		readPid := func(file string) int {
			t.Helper()
			b, err := os.ReadFile(file)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 0 {
				t.Fatalf("%s: got %q, %v, want a pid", file, b, err)
			}
			return pid
		}

		t.Run("SIGTERM", func(t *testing.T) {
			group, sleeper := e.path("group-term"), e.path("sleeper")
			// The sleep's output goes elsewhere: it must not hold sqllock's.
			r := e.run("run", "leftover", "--", "sh", "-c",
				"echo $$ > "+group+"; sleep 30 >/dev/null 2>&1 & echo $! > "+sleeper+"; exit 0")
			pgid, pid := readPid(group), readPid(sleeper)
			t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
			if r.status != 0 {
				t.Errorf("status: got %d, want the command's 0", r.status)
			}
			if live := liveInGroup(t, pgid); len(live) > 0 {
				t.Fatalf("after sqllock returned: got live processes %v in the command's group (the sleep is %d), want none", live, pid)
			}
			if !strings.Contains(r.stderr, "left processes running in its process group; stopped them with SIGTERM before releasing leftover") {
				t.Errorf("stderr: got %q, want it to say what it stopped", r.stderr)
			}
			if info := e.inspect("leftover"); info.Held {
				t.Errorf("after exit: got %+v, want the lease released", info)
			}
		})

		t.Run("SIGKILL", func(t *testing.T) {
			group, terms, ready := e.path("group-kill"), e.path("terms"), e.path("trap-ready")
			// A leftover that outlives SIGTERM: its handler writes a line
			// and the loop goes on. The command exits only once the trap
			// is set: a SIGTERM before it would end the leftover at once.
			script := "echo $$ > " + group + "; (trap 'echo term >> " + terms + "' TERM; echo ok > " + ready +
				"; while :; do sleep 0.05; done) >/dev/null 2>&1 & while [ ! -s " + ready + " ]; do sleep 0.01; done; exit 0"
			_, wait := e.start("run", "--kill-grace", "1s", "stubborn", "--", "sh", "-c", script)
			waitFor(t, 10*time.Second, "the leftover to get SIGTERM", func() bool { return len(e.lines("terms")) > 0 })
			pgid := readPid(group)
			t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
			if info := e.inspect("stubborn"); !info.Held {
				t.Errorf("while the leftover is being stopped: got %+v, want the name still held", info)
			}
			r := wait()
			if r.status != 0 {
				t.Errorf("status: got %d, want the command's 0", r.status)
			}
			if live := liveInGroup(t, pgid); len(live) > 0 {
				t.Fatalf("after sqllock returned: got live processes %v in the command's group, want none", live)
			}
			if !strings.Contains(r.stderr, "stopped them with SIGTERM, then SIGKILL") {
				t.Errorf("stderr: got %q, want SIGTERM, then SIGKILL", r.stderr)
			}
			if info := e.inspect("stubborn"); info.Held {
				t.Errorf("after exit: got %+v, want the lease released", info)
			}
		})
	})
}

// The operator commands read and change the table, in JSON for scripts and
// in text for people.
func TestOperatorCommands(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		ctx := context.Background()
		c := e.client(sqllock.WithHolder("ops-host:1"))
		l, err := c.TryAcquire(ctx, "report", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		want := lease{Name: "report", Holder: "ops-host:1", Fence: l.Fence(), Held: true}
		leaseOK := func(what string, got lease) {
			t.Helper()
			if got.TTL <= 30 || got.TTL > 60 {
				t.Errorf("%s: got ttl %v s, want under a minute", what, got.TTL)
			}
			got.TTL = 0
			if got != want {
				t.Errorf("%s: got %+v, want %+v", what, got, want)
			}
		}

		var list []lease
		e.runJSON(&list, "list", "--json")
		if len(list) != 1 {
			t.Fatalf("list --json: got %d leases, want 1", len(list))
		}
		leaseOK("list --json", list[0])
		if r := e.run("list"); !strings.Contains(r.stdout, "report") || !strings.Contains(r.stdout, "ops-host:1") {
			t.Errorf("list: got %q, want the lease", r.stdout)
		}

		var got lease
		e.runJSON(&got, "inspect", "report", "--json")
		leaseOK("inspect --json", got)
		if r := e.run("inspect", "report"); !strings.Contains(r.stdout, "held by ops-host:1") {
			t.Errorf("inspect: got %q, want the holder", r.stdout)
		}

		if r := e.run("release", "report"); r.status != exitUsage {
			t.Errorf("release without --force: got status %d, want %d", r.status, exitUsage)
		}
		var rel struct {
			Released  bool    `json:"released"`
			Was       *lease  `json:"was"`
			LockDelay float64 `json:"lock_delay_seconds"`
		}
		e.runJSON(&rel, "release", "--force", "--json", "report")
		if !rel.Released || rel.Was == nil {
			t.Fatalf("release --force --json: got %+v, want released", rel)
		}
		leaseOK("release --force --json", *rel.Was)
		// About a minute left: the default lock-delay is a third and 6 s.
		if rel.LockDelay < 20 || rel.LockDelay > 26 {
			t.Errorf("release --force --json: got lock_delay_seconds %v, want about 26", rel.LockDelay)
		}
		if err := l.Refresh(ctx, time.Minute); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Errorf("the evicted holder's refresh: got %v, want ErrNotHeld", err)
		}
		e.runJSON(&got, "inspect", "--json", "report")
		if want := (lease{Name: "report", Holder: "lock-delay after a forced release of ops-host:1", Fence: l.Fence(), Held: true, TTL: got.TTL}); got != want || got.TTL > rel.LockDelay {
			t.Errorf("inspect --json under the lock-delay: got %+v, want %+v, under %v s left", got, want, rel.LockDelay)
		}
		inspected := e.run("inspect", "report")
		if want := "report: under a lock-delay after a forced release of ops-host:1, fence " + strconv.FormatUint(l.Fence(), 10) + ": nobody can take it for "; !strings.HasPrefix(inspected.stdout, want) {
			t.Errorf("inspect under the lock-delay: got %q, want %q...", inspected.stdout, want)
		}
		again := e.run("release", "--force", "report")
		if want := "report: under a lock-delay after a forced release of ops-host:1 (fence " + strconv.FormatUint(l.Fence(), 10) + "): nobody can take it for "; again.status != 0 ||
			!strings.HasPrefix(again.stdout, want) || !strings.HasSuffix(again.stdout, "s (lock-delay; --lock-delay=0 to free it at once)\n") {
			t.Errorf("release --force under the lock-delay: got %d, %q, want 0 and %q...", again.status, again.stdout, want)
		}
		if r := e.run("release", "--force", "--lock-delay", "-1s", "report"); r.status != exitUsage || !strings.Contains(r.stderr, "must be 0 or more") {
			t.Errorf("--lock-delay -1s: got %d, %q, want %d", r.status, r.stderr, exitUsage)
		}
		freed := e.run("release", "--force", "--lock-delay=0", "report")
		if want := "report: released the lock-delay after a forced release of ops-host:1 (fence " + strconv.FormatUint(l.Fence(), 10) + "); free now\n"; freed.status != 0 || freed.stdout != want {
			t.Errorf("release --force --lock-delay=0: got %d, %q, want 0 and %q", freed.status, freed.stdout, want)
		}
		e.runJSON(&got, "inspect", "--json", "report")
		if got.Held || got.Fence != l.Fence() {
			t.Errorf("inspect after release: got %+v, want free with fence %d", got, l.Fence())
		}
		if r := e.run("release", "--force", "report"); r.status != 0 || !strings.Contains(r.stdout, "no lease") {
			t.Errorf("release of a free name: got %d, %q, want 0 and no lease", r.status, r.stdout)
		}

		// A live lease with --lock-delay: exactly that long.
		l2, err := c.TryAcquire(ctx, "report", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		timed := e.run("release", "--force", "--lock-delay", "90s", "report")
		if want := "report: released the lease of ops-host:1 (fence " + strconv.FormatUint(l2.Fence(), 10) + ", "; timed.status != 0 || !strings.HasPrefix(timed.stdout, want) ||
			!strings.HasSuffix(timed.stdout, " left); nobody can take it for 1m30s (lock-delay; --lock-delay=0 to free it at once)\n") {
			t.Errorf("release --force --lock-delay 90s: got %d, %q, want 0 and %q... 1m30s", timed.status, timed.stdout, want)
		}
		if info := e.inspect("report"); !info.Held || info.TTL <= time.Minute {
			t.Errorf("after --lock-delay 90s: got %+v, want held for more than the minute the lease had", info)
		}
		// And 0: free at once, the evicted holder told at its next renewal.
		e.run("release", "--force", "--lock-delay", "0", "report")
		l3, err := c.TryAcquire(ctx, "report", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire after --lock-delay 0: %v", err)
		}
		zero := e.run("release", "--force", "--lock-delay", "0", "report")
		if !strings.HasSuffix(zero.stdout, " left); free now, and its holder learns of it at its next renewal\n") {
			t.Errorf("release --force --lock-delay 0: got %q, want free now", zero.stdout)
		}
		if l3.Fence() <= l2.Fence() || l2.Fence() <= l.Fence() {
			t.Errorf("fences: got %d, %d, %d, want them growing", l.Fence(), l2.Fence(), l3.Fence())
		}

		if _, err := c.Once(ctx, "seed", func(context.Context, *sqllock.Lock) error { return nil }); err != nil {
			t.Fatal(err)
		}
		var reset struct {
			Reset bool `json:"reset"`
		}
		e.runJSON(&reset, "once-reset", "--json", "seed")
		if !reset.Reset {
			t.Errorf("once-reset --json: got %+v, want reset", reset)
		}
		if ran, err := c.Once(ctx, "seed", func(context.Context, *sqllock.Lock) error { return nil }); err != nil || !ran {
			t.Errorf("Once after once-reset: got %v, %v, want it to run", ran, err)
		}
		if r := e.run("once-reset", "never"); r.status != 0 || !strings.Contains(r.stdout, "no completion record") {
			t.Errorf("once-reset of a name without record: got %d, %q", r.status, r.stdout)
		}
	})
}

// On a missing table each command says so once, names sqllock create-table
// with the table, and exits 1 (run 125); create-table --json says which
// table is there.
func TestCommands_missingTable(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		missing := "no_such_" + e.table
		// The last --table wins over the one e.run puts first.
		for _, args := range [][]string{
			{"list", "--table", missing},
			{"inspect", "job", "--table", missing},
			{"release", "--force", "job", "--table", missing},
			{"once-reset", "job", "--table", missing},
			{"run", "job", "--table", missing, "--", "true"},
		} {
			r := e.run(args...)
			want := exitFailure
			if args[0] == "run" {
				want = exitOwn
			}
			if r.status != want {
				t.Errorf("%s: got status %d, want %d", args[0], r.status, want)
			}
			hint := "create it with sqllock create-table --table " + missing
			if !strings.Contains(r.stderr, hint) || strings.Contains(r.stderr, "Client.CreateTable") {
				t.Errorf("%s: got %q, want %q and no Client.CreateTable", args[0], r.stderr, hint)
			}
			if strings.Contains(r.stderr, args[0]+": "+args[0]) {
				t.Errorf("%s: got %q, which says the command twice", args[0], r.stderr)
			}
		}
		var created struct {
			Table  string `json:"table"`
			Exists bool   `json:"exists"`
		}
		e.runJSON(&created, "create-table", "--json")
		if created.Table != e.table || !created.Exists {
			t.Errorf("create-table --json: got %+v, want table %s, exists", created, e.table)
		}
	})
}

func (e *env) runJSON(v any, args ...string) {
	e.t.Helper()
	r := e.run(args...)
	if r.status != 0 {
		e.t.Fatalf("%q: status %d, stderr %q", args, r.status, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		e.t.Fatalf("%q: output %q is not JSON: %v", args, r.stdout, err)
	}
}

// startStallProxy starts a fault proxy to target, stopped in t.Cleanup; its
// Stall(faultproxy.Both) holds every byte in both directions, as a
// partition would, and Stall(0) delivers them.
func startStallProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// -q keeps a run that finds the name held silent (exit 75, nothing on
// stderr, as flock -n), for cron's mail; a real failure still speaks.
func TestRun_quietHeld(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		if _, err := e.client().TryAcquire(context.Background(), "nightly", time.Minute); err != nil {
			t.Fatal(err)
		}
		for _, flag := range []string{"-q", "--quiet-held"} {
			r := e.run("run", flag, "nightly", "--", "sh", "-c", "echo ran >> "+e.path("runs"))
			if r.status != exitConflict || r.stderr != "" || r.stdout != "" {
				t.Errorf("%s, held: got status %d, stderr %q; want %d and nothing", flag, r.status, r.stderr, exitConflict)
			}
		}
		if _, err := e.client().Semaphore("exports", 1).TryAcquire(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
		r := e.run("run", "-q", "-n", "1", "exports", "--", "true")
		if r.status != exitConflict || r.stderr != "" {
			t.Errorf("-q -n 1, every slot held: got status %d, stderr %q; want %d and nothing", r.status, r.stderr, exitConflict)
		}
		if got := e.lines("runs"); len(got) != 0 {
			t.Errorf("the job ran %d times while held", len(got))
		}
		r = e.run("run", "-q", "--table", "no_such_table", "other", "--", "true")
		if r.status != exitOwn || !strings.Contains(r.stderr, "no_such_table") {
			t.Errorf("-q, missing table: got status %d, stderr %q; want %d naming the table", r.status, r.stderr, exitOwn)
		}
	})
}
