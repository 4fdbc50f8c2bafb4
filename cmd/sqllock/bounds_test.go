package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func TestSetLimits(t *testing.T) {
	tests := []struct {
		dsn               string
		dial, read, write limit
	}{
		{"u@tcp(h:1)/d", limit{time.Second, "--timeout"}, limit{7 * time.Second, "io"}, limit{7 * time.Second, "io"}},
		{"u@tcp(h:1)/d?timeout=2s&readTimeout=3s&writeTimeout=4s",
			limit{2 * time.Second, "the DSN's timeout"}, limit{3 * time.Second, "the DSN's readTimeout"}, limit{4 * time.Second, "the DSN's writeTimeout"}},
		{"u@tcp(h:1)/d?readTimeout=3s", limit{time.Second, "--timeout"}, limit{3 * time.Second, "the DSN's readTimeout"}, limit{7 * time.Second, "io"}},
	}
	for _, tt := range tests {
		cfg, err := mysql.ParseDSN(tt.dsn)
		if err != nil {
			t.Fatal(err)
		}
		sl := setLimits(cfg, time.Second, limit{7 * time.Second, "io"})
		if sl.dial != tt.dial || sl.read != tt.read || sl.write != tt.write {
			t.Errorf("%s: got %v, %v, %v, want %v, %v, %v", tt.dsn, sl.dial, sl.read, sl.write, tt.dial, tt.read, tt.write)
		}
		if cfg.Timeout != tt.dial.d || cfg.ReadTimeout != tt.read.d || cfg.WriteTimeout != tt.write.d {
			t.Errorf("%s: the driver got %v, %v, %v, want %v, %v, %v", tt.dsn, cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout, tt.dial.d, tt.read.d, tt.write.d)
		}
	}
}

// run's reads are never cut before a keep-alive's renewal would give up by
// itself (ttl/4).
func TestRunConfig_ioLimit(t *testing.T) {
	for _, tt := range []struct {
		ttl, timeout, want time.Duration
	}{
		{30 * time.Second, 10 * time.Second, 10 * time.Second},
		{40 * time.Second, 10 * time.Second, 10 * time.Second},
		{2 * time.Minute, 10 * time.Second, 30 * time.Second},
		{2 * time.Minute, time.Second, 30 * time.Second},
	} {
		c := &runConfig{common: common{timeout: tt.timeout}, ttl: tt.ttl}
		if got := c.ioLimit().d; got != tt.want {
			t.Errorf("--ttl %v --timeout %v: got %v, want %v", tt.ttl, tt.timeout, got, tt.want)
		}
	}
}

// startSilentServer listens on 127.0.0.1, accepts every connection and
// never writes a byte: a frozen mysqld, or a proxy whose server stalled.
func startSilentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// startCost is how long the command takes to start, say its usage and exit
// on this machine now: what a command's bound cannot include.
func startCost(t *testing.T) time.Duration {
	t.Helper()
	cmd := exec.Command(os.Args[0], "help")
	cmd.Env = append(os.Environ(), asCommandEnv+"=1")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sqllock help: %v\n%s", err, out)
	}
	return time.Since(start)
}

// Against a server that accepts connections and never answers, every
// command ends within the bound it states (--timeout, and for run --wait
// plus --timeout), non-zero, saying that the server did not answer within
// that bound. A command still running past its bound and a few seconds
// is killed, and the test fails.
func TestCommands_silentServer(t *testing.T) {
	addr := startSilentServer(t)
	dsn := "sqllock:secret@tcp(" + addr + ")/app"
	tests := []struct {
		name   string
		dsn    string
		args   []string
		bound  time.Duration
		status int
		says   string
	}{
		{"run", dsn, []string{"run", "--timeout", "1s", "job", "--", "true"}, time.Second, exitOwn, "within --timeout 1s; not running true"},
		{"run --wait", dsn, []string{"run", "job", "--wait", "1s", "--timeout", "1s", "--", "true"}, 2 * time.Second, exitOwn, "within --wait 1s + --timeout 1s; not running true"},
		{"list", dsn, []string{"list", "--timeout", "1s"}, time.Second, exitFailure, "within --timeout 1s"},
		{"inspect", dsn, []string{"inspect", "job", "--timeout", "1s"}, time.Second, exitFailure, "within --timeout 1s"},
		{"release", dsn, []string{"release", "--force", "job", "--timeout", "1s"}, time.Second, exitFailure, "within --timeout 1s"},
		{"once-reset", dsn, []string{"once-reset", "job", "--timeout", "1s"}, time.Second, exitFailure, "within --timeout 1s"},
		{"create-table", dsn, []string{"create-table", "--timeout", "1s"}, time.Second, exitFailure, "within --timeout 1s"},
		{"list, default timeout", dsn, []string{"list"}, defaultTimeout, exitFailure, "within --timeout 10s"},
		{"run, default timeout", dsn, []string{"run", "job", "--", "true"}, defaultTimeout, exitOwn, "within --timeout 10s"},
		// The DSN: each read is cut after a second, and run
		// retries; the message names the DSN's bound, not "invalid
		// connection".
		{"run, the DSN's readTimeout", dsn + "?timeout=1s&readTimeout=1s", []string{"run", "--wait", "2s", "job", "--", "true"}, 2*time.Second + defaultTimeout, exitOwn, "within 1s (the DSN's readTimeout)"},
		{"inspect, the DSN's readTimeout", dsn + "?readTimeout=1s", []string{"inspect", "job"}, defaultTimeout, exitFailure, "within 1s (the DSN's readTimeout)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Past this the command hangs: kill it, and fail. The grace
			// grows with what starting the command costs now: at a load
			// average of 25 a start took seconds, past a fixed 3 s.
			grace := 3*time.Second + 2*startCost(t)
			ctx, cancel := context.WithTimeout(context.Background(), tt.bound+grace+5*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], tt.args...)
			cmd.Env = append(os.Environ(), asCommandEnv+"=1", "SQLLOCK_DSN="+tt.dsn)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			start := time.Now()
			err := cmd.Run()
			took := time.Since(start)
			t.Logf("sqllock %s: %v after %v\nstderr: %s", strings.Join(tt.args, " "), err, took, stderr.String())
			if ctx.Err() != nil {
				t.Fatalf("still running %v after it started, with a bound of %v: killed", took.Round(time.Millisecond), tt.bound)
			}
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) {
				t.Fatalf("got %v, want an exit status", err)
			}
			if got := cmd.ProcessState.ExitCode(); got != tt.status {
				t.Errorf("status: got %d, want %d", got, tt.status)
			}
			if took > tt.bound+grace {
				t.Errorf("took %v, want within its bound %v and %v", took.Round(time.Millisecond), tt.bound, grace)
			}
			msg := stderr.String()
			if !strings.Contains(msg, "the server at "+addr+" did not answer "+tt.says) {
				t.Errorf("stderr: got %q, want it to say the server at %s did not answer %s", msg, addr, tt.says)
			}
			if strings.Contains(msg, "invalid connection") {
				t.Errorf("stderr: got %q, want no \"invalid connection\"", msg)
			}
		})
	}
}
