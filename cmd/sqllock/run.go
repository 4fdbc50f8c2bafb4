package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/observe"
)

// Defaults of run's flags.
const (
	defaultTTL       = 30 * time.Second
	defaultKillGrace = 3 * time.Second
)

type runConfig struct {
	common
	wait         time.Duration
	ttl          time.Duration
	minHold      time.Duration
	killGrace    time.Duration
	conflictCode int
	quietHeld    bool // -q: say nothing when another holds the name
	verbose      bool
	metrics      string // --metrics: where to serve the Client's metrics
	textfile     string // --metrics-textfile: where to write them
	slots        int    // -n: run under one of the semaphore NAME's slots (run_slots.go)
	slot         *sqllock.Lock
	name         string
	argv         []string
	start        time.Time    // when the wait for the lease began
	attempts     atomic.Int64 // acquire statements the last acquire call sent
}

// countAttempts returns obs, which also counts in c.attempts the acquire
// statements of each acquire call, so that -v says "after waiting" only
// when the first was refused: the time before it is the connection's and
// the Client's first use, not a wait.
func (c *runConfig) countAttempts(obs observe.Observer) observe.Observer {
	done := obs.AcquireDone
	obs.AcquireDone = func(e observe.AcquireEvent) {
		c.attempts.Store(int64(e.Attempts))
		if done != nil {
			done(e)
		}
	}
	return obs
}

// margin is how long before the lease could expire the command is told to
// stop: the kill grace, plus a tenth of the lease for the kill to land and
// for the client's clock to run slow of the server's.
func (c *runConfig) margin() time.Duration { return c.killGrace + c.ttl/10 }

// parseRun parses run's arguments; when they are wrong it says why on
// stderr and returns the exit status.
func parseRun(args []string, stderr io.Writer) (*runConfig, int) {
	c := &runConfig{}
	fs := newFlagSet("run")
	c.register(fs)
	fs.DurationVar(&c.wait, "wait", 0, "wait up to `DURATION` for the name when another holds it (default: exit at once)")
	fs.DurationVar(&c.ttl, "ttl", defaultTTL, "lease length `DURATION`, at least 1s; a keep-alive renews it every ttl/3 while the command runs")
	fs.DurationVar(&c.minHold, "min-hold", 0, "keep the name taken until `DURATION` after it was acquired, even if the command ends sooner")
	fs.DurationVar(&c.killGrace, "kill-grace", defaultKillGrace, "SIGKILL the command's process group `DURATION` after SIGTERM (on a lost lease, and for what the command leaves running); kill-grace + ttl/10 must stay under ttl/2")
	fs.IntVar(&c.conflictCode, "conflict-exit-code", exitConflict, "exit `status` when another host holds the name")
	quiet := "quiet: when another host holds the name, exit with --conflict-exit-code (75) and print nothing, as flock -n does, so that cron mails only real failures"
	fs.BoolVar(&c.quietHeld, "q", false, quiet)
	fs.BoolVar(&c.quietHeld, "quiet-held", false, "the same as -q")
	fs.BoolVar(&c.verbose, "v", false, "say what happens on stderr: waiting, fence, release")
	c.registerSlots(fs)
	fs.StringVar(&c.metrics, "metrics", "", "serve the lock's metrics at http://`ADDR`/metrics, in Prometheus's text format, while the command runs (host:port)")
	fs.StringVar(&c.textfile, "metrics-textfile", "", "write the lock's metrics to `PATH` (a .prom file in node_exporter's textfile collector folder) at the start, on each change and at the exit, with the exit status, atomically")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sqllock run [flags] NAME [flags] -- COMMAND [ARGS...]")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), `Exit status: the command's; 75 (-q: silently) when another holds NAME; 124 when
the lease was lost and the command killed; 125 when sqllock failed; 126, 127
when the command could not run. If sqllock itself is killed (even kill -9), a
watchdog process kills the command's whole process group.
`)
	}
	operands, command, dashdash, err := parseArgs(fs, args, 1, stderr)
	if err != nil {
		return nil, usageStatus(err)
	}
	bad := func(format string, a ...any) (*runConfig, int) {
		fmt.Fprintf(stderr, "sqllock run: "+format+"\n", a...)
		return nil, exitUsage
	}
	want := "want sqllock run [flags] NAME -- COMMAND [ARGS...]"
	switch {
	case len(operands) == 0:
		return bad("no NAME before the command: %s", want)
	case len(operands) > 1:
		return bad("%d words before --, %s: %s", len(operands), quoteArgs(operands), want)
	case len(command) == 0 && dashdash:
		return bad("no COMMAND after --: %s", want)
	case len(command) == 0:
		return bad("no COMMAND after NAME %s: %s", quoteArgs(operands), want)
	case c.ttl < time.Second:
		return bad("--ttl %v is below 1s", c.ttl)
	case c.wait < 0 || c.minHold < 0 || c.killGrace < 0:
		return bad("--wait, --min-hold and --kill-grace must not be negative")
	case c.margin() >= c.ttl/2:
		return bad("--kill-grace %v does not fit in a %v lease: the command is stopped %v before the lease could expire, which must stay under half the ttl (%v); raise --ttl or lower --kill-grace",
			c.killGrace, c.ttl, c.margin(), c.ttl/2)
	case c.slots < 0 || c.slots > sqllock.MaxSlots:
		return bad("-n %d is outside 1..%d (0: a lock, not a semaphore)", c.slots, sqllock.MaxSlots)
	case c.conflictCode < 0 || c.conflictCode > 255:
		return bad("--conflict-exit-code %d is outside 0..255", c.conflictCode)
	}
	if err := c.check(); err != nil {
		return bad("%v", err)
	}
	c.name, c.argv = operands[0], command
	return c, 0
}

// ioLimit bounds each read and write of run's connections, unless the DSN
// does: --timeout, but never less than a keep-alive gives each renewal
// (ttl/4, see [sqllock.Lock.KeepAlive]), so that a renewal that waits on a
// busy server is cut by its own bound, not by the driver's. Every call run
// makes has a deadline of its own besides.
func (c *runConfig) ioLimit() limit {
	if c.ttl/4 > c.timeout {
		return limit{c.ttl / 4, "ttl/4, the bound of a renewal"}
	}
	return limit{c.timeout, "--timeout"}
}

// startBound is how long run waits for COMMAND to start: the wait for the
// lease and then one --timeout for the server's answers.
func (c *runConfig) startBound() time.Duration { return c.wait + c.timeout }

func (c *runConfig) startBoundText() string {
	if c.wait == 0 {
		return fmt.Sprintf("--timeout %v", c.timeout)
	}
	return fmt.Sprintf("--wait %v + --timeout %v", c.wait, c.timeout)
}

// deadlineRetry is --wait: the Client's default backoff, until a deadline.
type deadlineRetry struct {
	deadline time.Time
	backoff  sqllock.RetryStrategy
}

func (d *deadlineRetry) Backoff(attempt int) (time.Duration, bool) {
	left := time.Until(d.deadline)
	if left <= 0 {
		return 0, false
	}
	wait, _ := d.backoff.Backoff(attempt)
	return min(wait, left), true
}

// outcome is what happened to the child.
type outcome struct {
	started   bool
	status    int      // its exit status, when it ran
	leftovers []string // the signals that stopped what it left in its group
	lost      error    // the loss that made sqllock kill it
	evicted   string   // when a forced release was the loss: what evictedText says
	ownErr    error    // what stopped sqllock from starting it
	execErr   error    // why it could not start
}

func runCmd(ctx context.Context, args []string, stderr io.Writer) (status int) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	c, status := parseRun(args, stderr)
	if c == nil {
		return status
	}
	say := func(format string, a ...any) {
		fmt.Fprintf(stderr, "sqllock: %s\n", unprefix(fmt.Sprintf(format, a...)))
	}
	verbose := func(format string, a ...any) {
		if c.verbose {
			say(format, a...)
		}
	}
	// A command that cannot run must not take the name from a host where it can.
	path, err := exec.LookPath(c.argv[0])
	if err != nil {
		say("%v", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitNoExec
	}
	retry := &deadlineRetry{backoff: sqllock.ExponentialBackoff(8*time.Millisecond, 256*time.Millisecond)} // the Client's default
	// Renewal failures and loss are worth a line in cron's mail; -v adds
	// the retries.
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(skipLoss{slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})})
	clientOpts := []sqllock.Option{sqllock.WithRetry(retry), sqllock.WithLogger(logger)}
	var obs observe.Observer
	if c.metrics != "" || c.textfile != "" {
		m := newMetrics()
		if c.textfile != "" {
			tf, err := startTextfile(c.textfile, c.name, m)
			if err != nil {
				say("%v", err)
				return exitUsage
			}
			defer func() {
				if err := tf.close(status); err != nil {
					say("%v", err)
				}
			}()
		}
		if c.metrics != "" {
			stop, err := serveMetrics(c.metrics, m)
			if err != nil {
				say("%v", err)
				return exitUsage
			}
			defer stop()
		}
		obs = m.observer()
	}
	clientOpts = append(clientOpts, sqllock.WithObserver(c.countAttempts(obs)))
	db, client, err := c.open(c.ioLimit(), clientOpts...)
	if err != nil {
		say("%v", err)
		return exitUsage
	}
	defer db.Close()
	defer client.Close()
	adoptOrphans()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s := &session{cancel: cancel}
	go func() {
		for sig := range sigs {
			s.signal(sig)
		}
	}()

	var out outcome
	fn := func(lctx context.Context) error {
		out = c.runChild(lctx, client, s, path, verbose)
		if out.lost != nil {
			return out.lost
		}
		return out.ownErr
	}
	opts := []sqllock.DoOption{sqllock.WithMinHold(c.minHold), sqllock.WithSafetyMargin(c.margin())}
	c.start = time.Now()
	// Do's context is also its work's, so the bound on the wait cannot be
	// a deadline of it: it ends the wait only until the command starts.
	bound := time.AfterFunc(c.startBound(), s.expire)
	if c.wait > 0 {
		retry.deadline = c.start.Add(c.wait)
		verbose("waiting up to %v for %s", c.wait, c.name)
	}
	work := func(ctx context.Context, _ *sqllock.Lock) error { return fn(ctx) }
	switch {
	case c.slots > 0:
		err = c.doSlot(ctx, client, fn, opts)
	case c.wait > 0:
		err = client.Do(ctx, c.name, c.ttl, work, opts...)
	default:
		var l *sqllock.Lock
		if l, err = client.TryAcquire(ctx, c.name, c.ttl); err == nil {
			err = l.Do(ctx, work, opts...)
		}
	}
	bound.Stop()
	expired := s.waitOver()

	if len(out.leftovers) > 0 {
		say("%s exited and left processes running in its process group; stopped them with %v before releasing %s",
			quoteArgs(c.argv), strings.Join(out.leftovers, ", then "), c.name)
	}
	switch {
	case out.lost != nil:
		if out.evicted != "" {
			say("the lease on %s %s", c.leaseName(), out.evicted)
		} else {
			say("the lease on %s was lost while %s ran (%v); killed it", c.name, quoteArgs(c.argv), out.lost)
		}
		return exitLost
	case out.started && errors.Is(err, sqllock.ErrLockLost):
		say("%s finished, but the lease on %s was found lost at release (%v): its work may have overlapped another holder's", quoteArgs(c.argv), c.name, err)
		return exitLost
	case out.started:
		if err != nil {
			say("%s finished with status %d; releasing the lease on %s failed, it expires on its own: %s", quoteArgs(c.argv), out.status, c.name, c.errText(err, ""))
		} else if c.minHold > 0 {
			verbose("%s stays taken until %v after it was acquired", c.name, c.minHold)
		} else {
			verbose("released %s", c.name)
		}
		return out.status
	case out.execErr != nil:
		say("%v", out.execErr)
		if errors.Is(out.execErr, os.ErrNotExist) {
			return exitNotFound
		}
		return exitNoExec
	case s.signalled() != nil:
		say("stopped by %v while waiting for %s; not running %s", s.signalled(), c.name, quoteArgs(c.argv))
		return 128 + int(s.signalled().(syscall.Signal))
	case !expired && errors.Is(err, sqllock.ErrNotAcquired):
		if !c.quietHeld {
			say("%s; not running %s", c.held(client, time.Since(c.start)), quoteArgs(c.argv))
		}
		return c.conflictCode
	}
	msg := c.errText(err, "")
	if why := c.limits.noAnswer(err, expired, c.startBoundText()); why != "" {
		msg = withDetail(why+"; not running "+quoteArgs(c.argv), err, msg)
	}
	say("%s", msg)
	return exitOwn
}

// lossRecord is the message of the library's record of a lost lease.
const lossRecord = "sqllock: lease lost"

// skipLoss drops the library's record of a lost lease: run says it once,
// in its own line, with what the table tells of the cause.
type skipLoss struct{ slog.Handler }

func (h skipLoss) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == lossRecord {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h skipLoss) WithAttrs(attrs []slog.Attr) slog.Handler {
	return skipLoss{h.Handler.WithAttrs(attrs)}
}

func (h skipLoss) WithGroup(name string) slog.Handler { return skipLoss{h.Handler.WithGroup(name)} }

// held describes the holder that kept the name from us, for the message.
// It asks within what is left of the start bound.
func (c *runConfig) held(client *sqllock.Client, waited time.Duration) string {
	ctx, cancel := context.WithDeadline(context.Background(), c.start.Add(c.startBound()))
	defer cancel()
	if c.slots > 0 {
		return c.slotsHeld(ctx, client, waited)
	}
	info, ierr := client.Inspect(ctx, c.name)
	msg := c.name + " is held"
	switch {
	case ierr == nil && info.MinHold:
		msg = fmt.Sprintf("%s ran on %s and ended; its minimum hold keeps the name taken for %v more (fence %d)", c.name, info.Holder, roundTTL(info.TTL), info.Fence)
	case ierr == nil && info.Held:
		msg = fmt.Sprintf("%s is held by %s (fence %d, %v left)", c.name, info.Holder, info.Fence, roundTTL(info.TTL))
	}
	if c.wait > 0 {
		msg += fmt.Sprintf(" after waiting %v", waited.Round(time.Millisecond))
	}
	return msg
}

// runChild starts the command under the lease and waits for it. When lctx
// ends because the lease is lost, it sends SIGTERM to the command's process
// group, and SIGKILL after the kill grace, and returns only once the command
// has exited: all of it before the lease could expire. When the command
// exits by itself, what it left running in its group is stopped the same
// way before runChild returns and the lease is released.
func (c *runConfig) runChild(lctx context.Context, client *sqllock.Client, s *session, path string, verbose func(string, ...any)) outcome {
	acquired := time.Now()
	// The fence row is ours to read while we hold the lease.
	info, err := c.leaseInfo(lctx, client)
	if err != nil {
		return outcome{ownErr: err}
	}
	child := exec.Command(path, c.argv[1:]...)
	child.Args[0] = c.argv[0]
	child.Env = append(os.Environ(),
		"SQLLOCK_NAME="+c.name,
		"SQLLOCK_FENCE="+strconv.FormatUint(info.Fence, 10),
		"SQLLOCK_HOLDER="+info.Holder)
	child.Env = append(child.Env, c.slotEnv()...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.SysProcAttr = childAttr()
	// Should sqllock die once the command runs, the watchdog ends the
	// command's group. Disarmed once the group is stopped: deferred, it
	// runs after the kills below and stopLeftovers.
	dog, err := startWatchdog()
	if err != nil {
		verbose("%v; if sqllock is killed, only the command itself dies with it", err)
	}
	defer dog.disarm()
	started, err := s.start(child)
	switch {
	case err != nil:
		return outcome{execErr: err}
	case !started:
		// A signal or the start bound came first; runCmd says which.
		return outcome{ownErr: context.Cause(lctx)}
	}
	dog.watch(child.Process.Pid)
	waited := ""
	if c.attempts.Load() > 1 {
		waited = fmt.Sprintf(" after waiting %v", acquired.Sub(c.start).Round(time.Millisecond))
	}
	verbose("acquired %s%s (fence %d, ttl %v); running %s as pid %d",
		c.name, waited, info.Fence, c.ttl, quoteArgs(c.argv), child.Process.Pid)
	done := make(chan struct{})
	go func() {
		_ = child.Wait()
		close(done)
	}()
	out := outcome{started: true}
	var evicted chan string // what evictedText says, once the loss is seen
	select {
	case <-done:
		out.leftovers = s.stopLeftovers(c.killGrace)
	case <-lctx.Done():
		out.lost = context.Cause(lctx)
		verbose("lease on %s lost (%v); SIGTERM to process group %d", c.name, out.lost, child.Process.Pid)
		s.kill(syscall.SIGTERM)
		// Whether an operator took the lease, read while the command
		// stops: a lock-delay may end soon after.
		if errors.Is(out.lost, sqllock.ErrNotHeld) { // else the server did not answer
			evicted = make(chan string, 1)
			go func() { evicted <- c.evictedText(client, info) }()
		}
		grace := time.NewTimer(c.killGrace)
		select {
		case <-done:
			grace.Stop()
		case <-grace.C:
			verbose("SIGKILL to process group %d after %v", child.Process.Pid, c.killGrace)
			s.kill(syscall.SIGKILL)
			<-done
		}
		// Whatever the command left behind in its group goes too.
		s.kill(syscall.SIGKILL)
	}
	if evicted != nil {
		out.evicted = <-evicted
	}
	out.status = exitStatus(child.ProcessState)
	verbose("%s exited with status %d after %v", quoteArgs(c.argv), out.status, time.Since(acquired).Round(time.Millisecond))
	return out
}

// exitStatus is the status a shell would report: 128+N for a signal.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
