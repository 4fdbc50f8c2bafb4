package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/faultproxy"
)

// The faults -fault injects, -fault-after into the run, for -fault-for.
//
//   - partition-both, partition-to-server, partition-to-client: the first
//     -faulty processes reach the server through a proxy on 127.0.0.1 that
//     blackholes their traffic, both ways or one, then heals.
//   - pause: the first -faulty processes are stopped with SIGSTOP, then
//     continued with SIGCONT.
//   - crash: the server is killed with -kill-pid or -kill-cmd, then
//     -restart-cmd starts it again; -fault-for is not used.
var faultNames = []string{"partition-both", "partition-to-server", "partition-to-client", "pause", "crash"}

// cut returns the directions a partition fault blackholes.
func cut(fault string) (faultproxy.Direction, bool) {
	switch fault {
	case "partition-both":
		return faultproxy.Both, true
	case "partition-to-server":
		return faultproxy.ToServer, true
	case "partition-to-client":
		return faultproxy.ToClient, true
	}
	return 0, false
}

// checkFaultFlags adds to bad what is wrong with the fault flags, and fills
// in their defaults.
func checkFaultFlags(cfg *config, bad []string) []string {
	if cfg.fault == "" {
		if cfg.restartCmd != "" {
			bad = append(bad, "-restart-cmd needs -fault crash")
		}
		return bad
	}
	if !slices.Contains(faultNames, cfg.fault) {
		return append(bad, fmt.Sprintf("-fault must be one of %s", strings.Join(faultNames, ", ")))
	}
	if cfg.faultFor == 0 {
		cfg.faultFor = 3 * cfg.ttl
	}
	if cfg.faultAfter == 0 {
		cfg.faultAfter = cfg.duration / 3
	}
	if cfg.fault == "crash" {
		if !cfg.failover() || cfg.restartCmd == "" {
			bad = append(bad, "-fault crash needs -kill-pid or -kill-cmd, and -restart-cmd")
		}
		cfg.killAfter = cfg.faultAfter
		cfg.faultFor = 0
	} else if cfg.failover() || cfg.restartCmd != "" {
		bad = append(bad, "-kill-pid, -kill-cmd and -restart-cmd go with -fault crash only")
	}
	if cfg.faulty < 1 || cfg.faulty >= cfg.procs && cfg.fault != "crash" {
		bad = append(bad, "-faulty must be at least 1 and leave a process without the fault")
	}
	if cfg.faultAfter <= 0 || cfg.faultFor < 0 || cfg.faultAfter+cfg.faultFor >= cfg.duration {
		bad = append(bad, "-fault-after and -fault-for must end within -duration, leaving time to recover")
	}
	if cfg.maxRecovery < 0 {
		bad = append(bad, "-max-recovery must not be negative")
	}
	return bad
}

// proxies makes a partition run's proxies, one per DSN, and returns the
// DSNs that lead through them; nil, nil when the run makes no partition.
func proxies(cfg config) ([]*faultproxy.Proxy, []string, error) {
	if _, ok := cut(cfg.fault); !ok {
		return nil, nil, nil
	}
	var ps []*faultproxy.Proxy
	var dsns []string
	for _, d := range cfg.dsns {
		mc, err := mysql.ParseDSN(d)
		if err == nil && mc.Net != "tcp" {
			err = fmt.Errorf("a partition needs a TCP DSN, not %q", mc.Net)
		}
		var p *faultproxy.Proxy
		if err == nil {
			p, err = newProxy(mc.Addr)
		}
		if err != nil {
			for _, p := range ps {
				p.Close()
			}
			return nil, nil, err
		}
		ps = append(ps, p)
		mc.Addr = p.Addr()
		dsns = append(dsns, mc.FormatDSN())
	}
	return ps, dsns, nil
}

// A faultOutcome is when a fault began and healed (µs since 1970, this
// machine's clock, which the servers on it share), or what went wrong.
type faultOutcome struct {
	at, healedAt int64
	problem      string
}

// inject waits until faultAfter into the run, injects cfg.fault, and heals
// it: the proxies pass again, the stopped processes continue, the killed
// server is started again. A partition or a pause waits, up to a second
// more, for a faulty process to hold a name, so that the fault catches a
// holder.
func inject(ctx context.Context, cfg config, db *sql.DB, startAt time.Time, ps []*faultproxy.Proxy, procs []*os.Process) faultOutcome {
	if cfg.fault == "crash" {
		at, problem := kill(ctx, cfg, startAt)
		if problem != "" {
			return faultOutcome{problem: problem}
		}
		if out, err := exec.CommandContext(ctx, "sh", "-c", cfg.restartCmd).CombinedOutput(); err != nil {
			return faultOutcome{at: at, problem: fmt.Sprintf("-restart-cmd: %v: %s", err, out)}
		}
		return faultOutcome{at: at, healedAt: time.Now().UnixMicro()}
	}
	select {
	case <-time.After(time.Until(startAt.Add(cfg.faultAfter))):
	case <-ctx.Done():
		return faultOutcome{problem: ctx.Err().Error()}
	}
	waitForHolder(ctx, cfg, db, time.Now().Add(time.Second))
	d, partition := cut(cfg.fault)
	signal := func(sig syscall.Signal) error {
		for _, p := range procs[:cfg.faulty] {
			if err := p.Signal(sig); err != nil {
				return fmt.Errorf("%v to child %d: %w", sig, p.Pid, err)
			}
		}
		return nil
	}
	var o faultOutcome
	o.at = time.Now().UnixMicro()
	if partition {
		for _, p := range ps {
			p.Stall(d)
		}
	} else if err := signal(syscall.SIGSTOP); err != nil {
		o.problem = err.Error()
	}
	select {
	case <-time.After(cfg.faultFor):
	case <-ctx.Done():
		o.problem = ctx.Err().Error()
	}
	// Heal even when the context has ended: no process stays stopped.
	o.healedAt = time.Now().UnixMicro()
	if partition {
		for _, p := range ps {
			p.Stall(0)
		}
	} else if err := signal(syscall.SIGCONT); err != nil && o.problem == "" {
		o.problem = err.Error()
	}
	return o
}

// waitForHolder returns once one of the faulty processes holds a live
// lease, by the holder text each child gives its Client, or at until.
func waitForHolder(ctx context.Context, cfg config, db *sql.DB, until time.Time) {
	q := "SELECT COUNT(*) FROM `" + cfg.table + "` WHERE kind = 'L' AND expires_at > UTC_TIMESTAMP(6) AND holder IN ("
	var args []any
	for i := range cfg.faulty {
		if i > 0 {
			q += ", "
		}
		q += "?"
		args = append(args, holderOf(i))
	}
	q += ")"
	for time.Now().Before(until) && ctx.Err() == nil {
		var n int
		if err := db.QueryRowContext(ctx, q, args...).Scan(&n); err == nil && n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recovery measures, from the records, how the run came back from its
// fault: how many names were acquired again after the heal, the longest
// time from the heal until a name's first acquisition after it (µs), and
// how many of the faulty processes' sections were under way when the fault
// began.
func recovery(cfg config, o faultOutcome, records []record) (names int, longest int64, caught []record) {
	first := map[string]int64{}
	for _, r := range records {
		if r.Start > o.healedAt {
			if f, ok := first[r.Name]; !ok || r.Start < f {
				first[r.Name] = r.Start
			}
		}
		faulty := r.Proc < cfg.faulty || cfg.fault == "crash"
		if faulty && r.Acquired != 0 && r.Acquired < o.at && (r.End == 0 || r.End > o.at) {
			caught = append(caught, r)
		}
	}
	for _, f := range first {
		longest = max(longest, f-o.healedAt)
	}
	return len(first), longest, caught
}

// degraded returns the longest time (µs) a name went without a new
// acquisition from the fault's start until the heal's recovery: from the
// start to the name's first section after it, or between two sections'
// starts, up to the first section after the heal. A name held through the
// fault by a holder cut off from the server counts until it is taken over.
func degraded(o faultOutcome, records []record) int64 {
	starts := map[string][]int64{}
	for _, r := range records {
		if r.Start > o.at {
			starts[r.Name] = append(starts[r.Name], r.Start)
		}
	}
	var longest int64
	for _, ss := range starts {
		slices.Sort(ss)
		prev := o.at
		for _, s := range ss {
			longest = max(longest, s-prev)
			if s > o.healedAt {
				break
			}
			prev = s
		}
	}
	return longest
}

// faultPass reports whether the fault was injected and healed, every name
// was acquired again, and within -max-recovery when one is given.
func (s summary) faultPass(cfg config) bool {
	if cfg.fault == "" {
		return true
	}
	return s.fault.problem == "" && s.recovered == s.names &&
		(cfg.maxRecovery == 0 || time.Duration(s.recoveryMicros)*time.Microsecond <= cfg.maxRecovery)
}

// operations counts what the processes sent: acquire attempts, refreshes,
// protected writes and releases (one per acquisition).
func (s summary) operations(reports []childReport) int {
	n := s.Acquisitions + s.Accepted + s.StaleRejected + s.Maybe
	for _, r := range reports {
		n += r.Attempts + r.Refresh
	}
	return n
}

// formatFault writes the fault's lines of the summary.
func formatFault(p func(string, ...any), cfg config, s summary) {
	what := map[string]string{
		"partition-both":      "blackholed both ways",
		"partition-to-server": "blackholed client to server",
		"partition-to-client": "blackholed server to client",
		"pause":               "stopped (SIGSTOP)",
	}[cfg.fault]
	switch {
	case s.fault.problem != "":
		p("fault:                    %s failed: %s\n", cfg.fault, s.fault.problem)
	case cfg.fault == "crash":
		p("fault:                    crash: server killed %v into the run, answering again %.1fs later\n",
			cfg.faultAfter, float64(s.fault.healedAt-s.fault.at)/1e6)
	default:
		p("fault:                    %s: %d of %d processes %s %v into the run, for %v\n",
			cfg.fault, cfg.faulty, cfg.procs, what, cfg.faultAfter, cfg.faultFor)
	}
	p("holders caught by it:     %d (sections under way when it began)\n", len(s.caught))
	for i, r := range s.caught {
		if i == 5 {
			p("  ... and %d more\n", len(s.caught)-i)
			break
		}
		end := "ended by " + r.Err
		if r.Err == "" {
			end = fmt.Sprintf("ended %.2fs after the heal", float64(r.End-s.fault.healedAt)/1e6)
		}
		ka := ""
		if cfg.keepAlive {
			ka = fmt.Sprintf("; keep-alive reported the loss: %t", r.KeepAliveLost)
		}
		p("  %s on %q, fence %d: acquired %.2fs before the fault, %s; writes %d accepted, %d refused, %d unknown; lease taken over: %t%s\n",
			who(r), r.Name, r.Fence, float64(s.fault.at-r.Acquired)/1e6, end, r.Accepted, r.Rejected, r.Maybe, r.TakenOver, ka)
	}
	bound := ""
	if cfg.maxRecovery > 0 {
		bound = fmt.Sprintf(" (bound %v)", cfg.maxRecovery)
	}
	p("recovery:                 %d of %d names acquired again, the last %.2fs after the heal%s\n",
		s.recovered, s.names, float64(s.recoveryMicros)/1e6, bound)
	p("degraded:                 %.2fs at most without a new holder of a name, from the fault's start\n", float64(s.degradedMicros)/1e6)
}

// resultLine is the summary's last line before PASS or FAIL: the figures of
// docs/faults.md's table, for scripts/nemesis to gather.
func resultLine(cfg config, s summary, reports []childReport) string {
	fault := cfg.fault
	if fault == "" {
		fault = "none"
	}
	recovered, worst := "-", "-"
	if cfg.fault != "" {
		recovered = fmt.Sprintf("%.2f", float64(s.recoveryMicros)/1e6)
		worst = fmt.Sprintf("%.2f", float64(s.degradedMicros)/1e6)
	}
	return fmt.Sprintf("result: fault=%s operations=%d holders=%d takeovers=%d writes=%d refused=%d violations=%d lost=%d stale=%d degraded_s=%s recovery_s=%s errors=%d pass=%t\n",
		fault, s.operations(reports), s.Acquisitions, s.Takeovers, s.Accepted, s.StaleRejected, s.violations(), s.lost, s.stale, worst, recovered, s.opErrors(), s.pass())
}
