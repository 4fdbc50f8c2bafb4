package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		maxOperands int
		operands    []string
		rest        []string
		dashdash    bool
		json        bool
		wait        time.Duration
		err         string // in the message on stderr; "" for none
	}{
		{name: "flag after the operand", args: []string{"x", "--json"}, operands: []string{"x"}, json: true},
		{name: "flag before the operand", args: []string{"--json", "x"}, operands: []string{"x"}, json: true},
		{name: "flag with =", args: []string{"x", "--json=false", "-wait=2s"}, operands: []string{"x"}, wait: 2 * time.Second},
		{name: "flags after NAME, then --", args: []string{"x", "--wait", "5m", "-json", "--", "job", "--wait", "1s", "--"}, maxOperands: 1,
			operands: []string{"x"}, rest: []string{"job", "--wait", "1s", "--"}, dashdash: true, json: true, wait: 5 * time.Minute},
		{name: "the command starts at the word after NAME", args: []string{"x", "--wait", "1s", "job", "--json", "-v"}, maxOperands: 1,
			operands: []string{"x"}, rest: []string{"job", "--json", "-v"}, wait: time.Second},
		{name: "a word between NAME and --", args: []string{"x", "job", "-c", "--", "y"}, maxOperands: 1,
			operands: []string{"x", "job", "-c"}, rest: []string{"y"}, dashdash: true},
		{name: "-- before NAME", args: []string{"--", "-odd"}, rest: []string{"-odd"}, dashdash: true},
		{name: "a lone dash is an operand", args: []string{"-", "x"}, operands: []string{"-", "x"}},
		{name: "a value that looks like a flag", args: []string{"--table", "-t-", "x"}, operands: []string{"x"}},
		{name: "unknown flag after the operand", args: []string{"x", "--wiat", "5m", "--", "job"}, maxOperands: 1, err: "sqllock t: flag provided but not defined: -wiat"},
		{name: "missing value", args: []string{"x", "--wait"}, maxOperands: 1, err: "sqllock t: flag needs an argument: -wait"},
		{name: "bad value", args: []string{"x", "--wait", "--", "job"}, maxOperands: 1, err: `sqllock t: invalid value "--" for flag -wait`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFlagSet("t")
			var (
				json  bool
				wait  time.Duration
				table string
			)
			fs.BoolVar(&json, "json", false, "")
			fs.DurationVar(&wait, "wait", 0, "")
			fs.StringVar(&table, "table", "", "")
			var stderr bytes.Buffer
			operands, rest, dashdash, err := parseArgs(fs, tt.args, tt.maxOperands, &stderr)
			if tt.err != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.err) {
					t.Fatalf("got %v, stderr %q, want an error saying %q", err, stderr.String(), tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v, stderr %q, want no error", err, stderr.String())
			}
			if !slices.Equal(operands, tt.operands) || !slices.Equal(rest, tt.rest) || dashdash != tt.dashdash {
				t.Errorf("got operands %q, rest %q, dashdash %v, want %q, %q, %v", operands, rest, dashdash, tt.operands, tt.rest, tt.dashdash)
			}
			if json != tt.json || wait != tt.wait {
				t.Errorf("got --json %v --wait %v, want %v and %v", json, wait, tt.json, tt.wait)
			}
		})
	}
	t.Run("-h", func(t *testing.T) {
		fs := newFlagSet("t")
		fs.Bool("json", false, "print JSON")
		var stderr bytes.Buffer
		if _, _, _, err := parseArgs(fs, []string{"x", "-h"}, 0, &stderr); err != flag.ErrHelp || !strings.Contains(stderr.String(), "print JSON") {
			t.Fatalf("got %v, %q, want flag.ErrHelp and the flags", err, stderr.String())
		}
	})
}

// Flags after NAME are run's own, up to "--" (the issue: "run NAME --wait
// 5m -- job" exited 127, taking --wait for the command); what follows "--"
// reaches the command untouched.
func TestRun_flagsAfterName(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		r := e.run("run", "flags", "--wait", "5s", "-v", "--ttl", "10s", "--", "sh", "-c", `echo "$SQLLOCK_NAME" "$@"`, "sh", "--wait", "1s", "--")
		if r.status != 0 {
			t.Fatalf("status: got %d, want 0 (stderr %q)", r.status, r.stderr)
		}
		if got := strings.TrimSpace(r.stdout); got != "flags --wait 1s --" {
			t.Errorf("the command printed %q, want \"flags --wait 1s --\": its words after -- untouched", got)
		}
		for _, want := range []string{"waiting up to 5s for flags", "ttl 10s", "released flags"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q: the flags after NAME were not run's", want)
			}
		}

		// Without --, the command starts at the first word after NAME.
		r = e.run("run", "flags", "-v", "sh", "-c", `echo "$@"`, "sh", "-v")
		if r.status != 0 || strings.TrimSpace(r.stdout) != "-v" || !strings.Contains(r.stderr, "released flags") {
			t.Errorf("run NAME -v sh -c ... -v: got %d, %q, %q, want 0, the command's -v, and run's -v", r.status, r.stdout, r.stderr)
		}

	})
}

// Every operator command takes its flags before or after its operand, the
// same way; "--" ends them, so a NAME may start with '-'.
func TestOperatorCommands_flagsAnywhere(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		for _, args := range [][]string{
			{"list", "--json"},
			{"inspect", "--json", "name"},
			{"inspect", "name", "--json"},
			{"inspect", "--json", "--", "-name"},
			{"release", "name", "--force", "--json"},
			{"release", "--json", "--force", "name"},
			{"once-reset", "name", "--json"},
			{"once-reset", "--json", "name"},
			{"create-table", "--json"},
		} {
			var v any
			e.runJSON(&v, args...)
		}
	})
}

// Every command refuses flags and arguments it cannot parse, wherever they
// stand, with status 64 and a message that names the problem, before it
// connects or runs anything.
func TestCommands_badArguments(t *testing.T) {
	ran := filepath.Join(t.TempDir(), "ran")
	job := []string{"sh", "-c", "echo x > " + ran}
	tests := []struct {
		args []string
		want string
	}{
		{append([]string{"run", "job", "--wiat", "5m", "--"}, job...), "sqllock run: flag provided but not defined: -wiat"},
		{append([]string{"run", "job", "--wait", "--"}, job...), `sqllock run: invalid value "--" for flag -wait`},
		{[]string{"run", "job", "--wait"}, "sqllock run: flag needs an argument: -wait"},
		{[]string{"run", "job", "--"}, "sqllock run: no COMMAND after --"},
		{[]string{"run", "job"}, "sqllock run: no COMMAND after NAME"},
		{append([]string{"run", "--"}, job...), "sqllock run: no NAME before the command"},
		{append([]string{"run", "a", "b", "--"}, job...), "sqllock run: 2 words before --, a b:"},
		{append([]string{"run", "job", "sh", "-c", "x", "--"}, job...), `sqllock run: 4 words before --, job sh -c x:`},
		{append([]string{"run", "job", "--timeout", "0s", "--"}, job...), "sqllock run: --timeout 0s: must be above 0"},
		{append([]string{"run", "job", "--ttl", "500ms", "--"}, job...), "sqllock run: --ttl 500ms is below 1s"},
		{append([]string{"run", "job", "--ttl", "5s", "--kill-grace", "2s", "--"}, job...), "sqllock run: --kill-grace 2s does not fit in a 5s lease"},
		{[]string{"list", "--bogus"}, "sqllock list: flag provided but not defined: -bogus"},
		{[]string{"list", "extra"}, "sqllock list: got 1 arguments (extra), want 0"},
		{[]string{"inspect", "job", "--bogus"}, "sqllock inspect: flag provided but not defined: -bogus"},
		{[]string{"inspect"}, "sqllock inspect: no NAME given"},
		{[]string{"inspect", "a", "b"}, "sqllock inspect: got 2 arguments (a b), want 1"},
		{[]string{"release", "--force", "job", "--bogus"}, "sqllock release: flag provided but not defined: -bogus"},
		{[]string{"release", "job"}, "sqllock release: --force is required"},
		{[]string{"once-reset", "job", "--timeout", "-1s"}, "sqllock once-reset: --timeout -1s: must be above 0"},
		{[]string{"create-table", "--bogus"}, "sqllock create-table: flag provided but not defined: -bogus"},
	}
	for _, tt := range tests {
		cmd := exec.Command(os.Args[0], tt.args...)
		// Nothing listens there: a command that got past its arguments
		// would fail otherwise.
		cmd.Env = append(os.Environ(), asCommandEnv+"=1", "SQLLOCK_DSN=u@tcp(127.0.0.1:1)/d")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		if got := cmd.ProcessState.ExitCode(); got != exitUsage || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%q: got %d, %q, want %d and %q", tt.args, got, stderr.String(), exitUsage, tt.want)
		}
	}
	if _, err := os.Stat(ran); err == nil {
		t.Errorf("a command with bad arguments ran")
	}
}

// A DSN in another driver's URL form (mysql://user@host:3306/db), from
// --dsn or SQLLOCK_DSN, is refused with status 64 and one line that names
// the problem and the form to write, without the password; so is any DSN
// the driver cannot parse, with the driver's reason.
func TestCommands_badDSN(t *testing.T) {
	url := "sqllock list: --dsn is a URL (mysql://...), which go-sql-driver/mysql does not read: write it as user:password@tcp(host:3306)/dbname\n"
	tests := []struct {
		args   []string
		envDSN string
		want   string
	}{
		{[]string{"list", "--dsn", "mysql://root:s3cret@db:3306/app"}, "", url},
		{[]string{"list", "--dsn=mysql://root@127.0.0.1/app?parseTime=true"}, "", url},
		{[]string{"inspect", "job"}, "mariadb://root:s3cret@db/app",
			"sqllock inspect: SQLLOCK_DSN is a URL (mariadb://...), which go-sql-driver/mysql does not read: write it as user:password@tcp(host:3306)/dbname\n"},
		{[]string{"run", "job", "--", "true"}, "mysql://root:s3cret@db:3306/app",
			"sqllock: SQLLOCK_DSN is a URL (mysql://...), which go-sql-driver/mysql does not read: write it as user:password@tcp(host:3306)/dbname\n"},
		{[]string{"metrics", "--dsn", "root:s3cret@db:3306/app"}, "",
			"sqllock metrics: --dsn: default addr for network 'db:3306' unknown; a DSN reads user:password@tcp(host:3306)/dbname\n"},
	}
	for _, tt := range tests {
		cmd := exec.Command(os.Args[0], tt.args...)
		cmd.Env = append(os.Environ(), asCommandEnv+"=1", "SQLLOCK_DSN="+tt.envDSN)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		if got := cmd.ProcessState.ExitCode(); got != exitUsage || stderr.String() != tt.want {
			t.Errorf("%q with SQLLOCK_DSN=%q: got %d, %q, want %d and %q", tt.args, tt.envDSN, got, stderr.String(), exitUsage, tt.want)
		}
	}
}
