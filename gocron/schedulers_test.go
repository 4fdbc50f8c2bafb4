package gocronlock

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// The test binary is also the scheduler process: with childEnv set to a
// childSpec it runs one gocron scheduler instead of the tests, so that each
// scheduler is a process of its own, as on separate hosts. Each run of the
// job inserts a row into a table of the test's own, which the test counts.
const childEnv = "GOCRONLOCK_TEST_SCHEDULER"

// errLate is a scheduler process's exit status when it was not set up by
// its start time.
const errLate = 3

type childSpec struct {
	Mode    string // "locker" (NewLocker's defaults) or "elector"
	Job     string // "second": on every whole second; "5s": every 5 s from the start
	DSN     string
	Table   string // the locks
	Runs    string // the table each run inserts a row into
	ID      int
	StartAt int64 // unix ms
	StopAt  int64
}

// schedulerMain runs the scheduler spec describes and returns the exit
// status.
func schedulerMain(spec string) int {
	var s childSpec
	err := json.Unmarshal([]byte(spec), &s)
	if err == nil {
		err = s.run()
	}
	switch {
	case errors.Is(err, errNotReady):
		fmt.Fprintf(os.Stderr, "scheduler %d: %v\n", s.ID, err)
		return errLate
	case err != nil:
		fmt.Fprintf(os.Stderr, "scheduler %d: %v\n", s.ID, err)
		return 1
	}
	return 0
}

var errNotReady = errors.New("not ready by the start time")

func (s childSpec) run() error {
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := sqllock.New(db, sqllock.WithTable(s.Table))
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	var (
		opt gocron.SchedulerOption
		// askedAt is when gocron last asked the Locker or Elector to run
		// the job and was told yes (unix ms): the run's tick. On a loaded
		// machine the run may start a second later.
		askedAt atomic.Int64
	)
	insert := "INSERT INTO `" + s.Runs + "` (scheduler, at_ms, kind, why) VALUES (?, ?, ?, ?)"
	switch s.Mode {
	case "locker":
		// The defaults, as a user would, with a log of every skip, which
		// a test that fails prints.
		locker, err := NewLocker(ctx, c, WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))))
		if err != nil {
			return err
		}
		opt = gocron.WithDistributedLocker(&loggedLocker{Locker: locker, db: db, insert: insert, id: s.ID, askedAt: &askedAt})
	case "elector":
		elector, err := NewElector(ctx, c, "scheduler", WithTTL(5*time.Second))
		if err != nil {
			return err
		}
		defer elector.Close()
		opt = gocron.WithDistributedElector(&loggedElector{Elector: elector, db: db, insert: insert, id: s.ID, askedAt: &askedAt})
	default:
		return fmt.Errorf("unknown mode %q", s.Mode)
	}
	var def gocron.JobDefinition
	switch s.Job {
	case "second":
		def = gocron.CronJob("* * * * * *", true)
	case "5s":
		def = gocron.DurationJob(5 * time.Second)
	default:
		return fmt.Errorf("unknown job %q", s.Job)
	}
	sched, err := gocron.NewScheduler(opt)
	if err != nil {
		return err
	}
	var (
		mu   sync.Mutex
		errs []error
	)
	_, err = sched.NewJob(def, gocron.NewTask(func() {
		at := time.UnixMilli(askedAt.Load())
		time.Sleep(10 * time.Millisecond) // a job that takes 10 ms
		if _, err := db.Exec(insert, s.ID, at.UnixMilli(), ran, ""); err != nil {
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, fmt.Errorf("record the run at %v: %w", at, err))
		}
	}), gocron.WithName("job"))
	if err != nil {
		return err
	}
	// The Client's first write proves the server (a few round trips, and
	// waits of up to half a second each): made here, before the start, so
	// that under load it does not make the first run late for its window.
	warm, err := c.TryAcquire(ctx, fmt.Sprintf("warm-up-%d", s.ID), time.Second)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := warm.Release(ctx); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	start := time.UnixMilli(s.StartAt)
	if time.Now().After(start) {
		return fmt.Errorf("%w: set up at %v, %v late", errNotReady, time.Now(), time.Since(start))
	}
	time.Sleep(time.Until(start))
	sched.Start()
	time.Sleep(time.Until(time.UnixMilli(s.StopAt)))
	err = sched.Shutdown() // waits for a run under way
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(append(errs, err)...)
}

// A loggedLocker is a scheduler process's Locker that records when gocron
// asked it for each run's lock: a refusal as a row of the runs table, with
// why, and a lock taken in askedAt, for the run to record as its tick. It
// logs each Lock and Unlock to stderr, for a test that fails to say what
// each scheduler did at each tick.
type loggedLocker struct {
	*Locker
	db      *sql.DB
	insert  string
	id      int
	askedAt *atomic.Int64
}

func (l *loggedLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	called := time.Now()
	lk, err := l.Locker.Lock(ctx, key)
	fmt.Fprintf(os.Stderr, "%s Lock (called %s): %v\n", time.Now().Format("15:04:05.000"), called.Format("15:04:05.000"), err)
	if err != nil {
		l.record(called, refused, err.Error())
		return nil, err
	}
	l.askedAt.Store(called.UnixMilli())
	return loggedLock{Lock: lk, l: l}, nil
}

func (l *loggedLocker) record(at time.Time, kind, why string) {
	if _, err := l.db.Exec(l.insert, l.id, at.UnixMilli(), kind, why); err != nil {
		fmt.Fprintf(os.Stderr, "record %s at %v: %v\n", kind, at, err)
	}
}

// A loggedElector is a scheduler process's Elector that records when
// gocron asked it whether to run the job, as loggedLocker does: a
// follower's refusal as a row of the runs table, a leader's yes in
// askedAt.
type loggedElector struct {
	*Elector
	db      *sql.DB
	insert  string
	id      int
	askedAt *atomic.Int64
}

func (e *loggedElector) IsLeader(ctx context.Context) error {
	called := time.Now()
	err := e.Elector.IsLeader(ctx)
	if err != nil {
		if _, ierr := e.db.Exec(e.insert, e.id, called.UnixMilli(), refused, err.Error()); ierr != nil {
			fmt.Fprintf(os.Stderr, "record the refusal: %v\n", ierr)
		}
		return err
	}
	e.askedAt.Store(called.UnixMilli())
	return nil
}

// A loggedLock records when gocron called its Unlock: the end of the run.
type loggedLock struct {
	gocron.Lock
	l *loggedLocker
}

func (l loggedLock) Unlock(ctx context.Context) error {
	called := time.Now()
	err := l.Lock.Unlock(ctx)
	fmt.Fprintf(os.Stderr, "%s Unlock (called %s): %v\n", time.Now().Format("15:04:05.000"), called.Format("15:04:05.000"), err)
	l.l.record(called, unlocked, "") // after: its round trip is no part of the run
	return err
}

// A runRow is what a scheduler process recorded, on its clock (they share
// this machine's): a run of the job, at the moment gocron asked for it; a
// refusal to run it, and why; or the Unlock that ended a run.
type runRow struct {
	scheduler int
	at        time.Time
	kind      string // ran, refused or unlocked
	why       string // a refusal's error
}

// The kinds of runRow.
const (
	ran      = "R"
	refused  = "N"
	unlocked = "U"
)

func (r runRow) String() string {
	switch r.kind {
	case refused:
		return fmt.Sprintf("%d refused at %s: %s", r.scheduler, r.at.Format("15:04:05.000"), r.why)
	case unlocked:
		return fmt.Sprintf("%d unlocked at %s", r.scheduler, r.at.Format("15:04:05.000"))
	}
	return fmt.Sprintf("%d at %s", r.scheduler, r.at.Format("15:04:05.000"))
}

// only returns the rows of kind.
func only(rows []runRow, kind string) []runRow {
	var out []runRow
	for _, r := range rows {
		if r.kind == kind {
			out = append(out, r)
		}
	}
	return out
}

// schedulersOnEachServer runs the job on a group of scheduler processes per
// server, all groups at once, and then checks each group's runs in a
// subtest named for its server. The ith process of a group starts starts[i]
// after the group's start time and runs until d after it.
func schedulersOnEachServer(t *testing.T, mode, job string, starts []time.Duration, d time.Duration,
	check func(t *testing.T, runs []runRow, startAt, stopAt time.Time)) {
	t.Helper()
	servers := testdsn.Servers()
	if len(servers) == 0 {
		testdsn.NoServer(t, fmt.Sprintf("%s is not set: %s", testdsn.Env, testdsn.StartHint))
	}
	groups := make([]*schedulerGroup, len(servers))
	for i, s := range servers {
		if s.Err == nil && !s.Fake {
			groups[i] = startSchedulers(t, s.DSN, mode, job, starts, d)
		}
	}
	for i, s := range servers {
		t.Run(s.Label, func(t *testing.T) {
			if s.Err != nil {
				t.Fatal(s.Err)
			}
			if s.Fake {
				t.Skip("the scheduler processes open the MySQL driver on the DSN: the fake serves only the root package's tests")
			}
			runs := groups[i].wait(t)
			check(t, runs, groups[i].startAt, groups[i].stopAt)
		})
	}
}

// A schedulerGroup is the scheduler processes of one server.
type schedulerGroup struct {
	db              *sql.DB
	runsTable       string
	startAt, stopAt time.Time
	cmds            []*exec.Cmd
	outs            []bytes.Buffer
}

// startSchedulers starts a schedulerGroup on a lock table and a runs table
// of its own. The start time is a few seconds from now, for the processes
// to be set up by then; for a job on whole seconds it is on a half second,
// half a second from the ticks.
func startSchedulers(t *testing.T, dsn, mode, job string, starts []time.Duration, d time.Duration) *schedulerGroup {
	t.Helper()
	_, table := newClient(t, dsn)
	g := &schedulerGroup{db: openDB(t, dsn), cmds: make([]*exec.Cmd, len(starts)), outs: make([]bytes.Buffer, len(starts))}
	g.runsTable = newTable(t, g.db, "gocron_runs_")
	if _, err := g.db.Exec("CREATE TABLE `" + g.runsTable + "` (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, " +
		"scheduler INT NOT NULL, at_ms BIGINT NOT NULL, kind CHAR(1) NOT NULL, why VARCHAR(1000) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	g.startAt = time.Now().Add(schedulerLead).Truncate(time.Millisecond) // the processes get it in ms
	if job == "second" {
		g.startAt = g.startAt.Truncate(time.Second).Add(1500 * time.Millisecond)
	}
	g.stopAt = g.startAt.Add(d)
	for i, off := range starts {
		spec, err := json.Marshal(childSpec{Mode: mode, Job: job, DSN: dsn, Table: table, Runs: g.runsTable,
			ID: i, StartAt: g.startAt.Add(off).UnixMilli(), StopAt: g.stopAt.UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
		cmd.Stdout, cmd.Stderr = &g.outs[i], &g.outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		g.cmds[i] = cmd
		t.Cleanup(func() { _ = cmd.Process.Kill() }) // if the test ends before wait
	}
	return g
}

// schedulerLead is how long a scheduler process has to start and set up:
// a scheduler built with -race, started beside other packages' tests on a
// loaded 2-core machine, was not ready within 3 s.
const schedulerLead = 6 * time.Second

// wait waits for the group's processes to exit and returns the job's runs,
// in time order.
func (g *schedulerGroup) wait(t *testing.T) []runRow {
	t.Helper()
	late := false
	for i, cmd := range g.cmds {
		err := cmd.Wait()
		if g.outs[i].Len() > 0 {
			t.Logf("scheduler %d said:\n%s", i, g.outs[i].String())
		}
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit) && exit.ExitCode() == errLate:
			late = true
		case err != nil:
			t.Errorf("scheduler %d: %v", i, err)
		}
	}
	if late {
		t.Fatalf("a scheduler was not set up %v after it was started: the machine is too slow for this test", schedulerLead)
	}
	if t.Failed() {
		t.FailNow()
	}
	rows, err := g.db.Query("SELECT scheduler, at_ms, kind, why FROM `" + g.runsTable + "` ORDER BY at_ms, id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var runs []runRow
	for rows.Next() {
		var (
			r  runRow
			ms int64
		)
		if err := rows.Scan(&r.scheduler, &ms, &r.kind, &r.why); err != nil {
			t.Fatal(err)
		}
		r.at = time.UnixMilli(ms)
		runs = append(runs, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}

// checkEverySecondAsked fails the test unless each whole second between
// from and to ran the job once, as far as the schedulers' rows can tell:
// they say when gocron asked each scheduler's Locker or Elector to run the
// job, why it refused, and when a run ended (its Unlock). Each tick ran at
// most once, and a tick some scheduler was asked for ran, unless a run of
// an earlier tick was still under way as it began (gocron had not yet
// called its Unlock: a job of 10 ms starved for a second or more, which
// its scheduler does not run twice at once and the others find holding the
// name). A tick no scheduler was asked for is gocron's: it fires a job's
// next run only once the last Lock has returned. Those two are a starved
// machine's doing, logged; at most a third of the ticks may be missed so.
func checkEverySecondAsked(t *testing.T, rows []runRow, from, to time.Time) {
	t.Helper()
	runs := only(rows, ran)
	first, last := from.Unix()+1, to.Unix() // from and to are on half seconds
	ticks := ticksOf(t, runs, first, last)
	refusals := make(map[int64][]runRow)
	for _, r := range only(rows, refused) {
		refusals[r.at.Unix()] = append(refusals[r.at.Unix()], r)
	}
	ends := runEnds(rows)
	excused := 0
	for tick := first; tick <= last; tick++ {
		n, why := len(ticks[tick]), refusals[tick]
		start := time.Unix(tick, 0)
		var under []string
		for i, r := range runs {
			if r.at.Before(start) && ends[i].After(start) {
				under = append(under, fmt.Sprintf("%v to %s", r, ends[i].Format("15:04:05.000")))
			}
		}
		switch {
		case n > 1:
			t.Errorf("tick %d ran %d times %v, want once", tick, n, ticks[tick])
		case n == 1:
		case len(why) == 0:
			excused++
			t.Logf("tick %d: no scheduler was asked to run it (gocron was late: a starved machine)", tick)
		case len(under) > 0:
			excused++
			t.Logf("tick %d: a run of an earlier tick was still under way (%v; gocron's Unlock late: a starved machine): %v", tick, under, why)
		default:
			t.Errorf("tick %d did not run, refused by every scheduler asked: %v", tick, why)
		}
	}
	if excused > int(last-first+1)/3 {
		t.Errorf("%d of %d ticks missed on a starved machine: too many to check the rest", excused, last-first+1)
	}
	t.Logf("%d runs for the %d ticks %d to %d, by schedulers %v", len(runs), last-first+1, first, last, bySchedulers(runs))
}

// runEnds returns, for each run among rows (in order), when it ended: its
// scheduler's first Unlock after it, or, when its scheduler recorded no
// Unlock at all (an Elector), its start; a run whose Unlock never came ran
// on past the end.
func runEnds(rows []runRow) []time.Time {
	unlocks := make(map[int][]time.Time)
	for _, r := range only(rows, unlocked) {
		unlocks[r.scheduler] = append(unlocks[r.scheduler], r.at)
	}
	var ends []time.Time
	for _, r := range only(rows, ran) {
		us := unlocks[r.scheduler]
		end := r.at
		if len(us) > 0 {
			end = time.Unix(1<<40, 0)
			if i := slices.IndexFunc(us, func(u time.Time) bool { return !u.Before(r.at) }); i >= 0 {
				end = us[i]
			}
		}
		ends = append(ends, end)
	}
	return ends
}

// ticksOf groups runs by the whole second they ran in, failing the test
// for a run outside first to last.
func ticksOf(t *testing.T, runs []runRow, first, last int64) map[int64][]runRow {
	t.Helper()
	ticks := make(map[int64][]runRow)
	for _, r := range runs {
		tick := r.at.Unix() // a run starts after its tick, never before
		if tick < first || tick > last {
			t.Errorf("scheduler %d ran at %v, outside the ticks %d to %d", r.scheduler, r.at, first, last)
		}
		ticks[tick] = append(ticks[tick], r)
	}
	return ticks
}

// splaySlack is how long after the last scheduler's tick a run may start and
// still count for its interval.
const splaySlack = 2500 * time.Millisecond

// checkEveryInterval fails the test unless each interval of the job ran it
// once. The schedulers start at startAt plus at most spread, so the ticks
// of the kth interval fall between startAt+k*interval and spread after it.
func checkEveryInterval(t *testing.T, rows []runRow, startAt, stopAt time.Time, interval, spread time.Duration) {
	t.Helper()
	runs := only(rows, ran)
	// For a run's start to follow its tick: its Lock's acquire. At a load
	// average of 13 one took 1.7 s; the window stays inside its interval.
	const slack = splaySlack
	k := 0
	for ; startAt.Add(time.Duration(k+1)*interval + spread + slack).Before(stopAt); k++ {
		from := startAt.Add(time.Duration(k+1) * interval)
		var in []runRow
		for _, r := range runs {
			if !r.at.Before(from) && r.at.Before(from.Add(spread+slack)) {
				in = append(in, r)
			}
		}
		if len(in) != 1 {
			t.Errorf("interval %d (ticks from %s to %s): ran %d times %v, want once (all runs, from the start at %s: %v)", k+1,
				from.Format("15:04:05.000"), from.Add(spread).Format("15:04:05.000"), len(in), in, startAt.Format("15:04:05.000"), runs)
		}
	}
	if k < 3 {
		t.Fatalf("only %d intervals to check", k)
	}
	if len(runs) != k {
		t.Errorf("%d runs in %d intervals, want one per interval: %v", len(runs), k, runs)
	}
	t.Logf("%d runs in %d intervals of %v, by schedulers %v", len(runs), k, interval, bySchedulers(runs))
}

func bySchedulers(runs []runRow) map[int]int {
	n := make(map[int]int)
	for _, r := range runs {
		n[r.scheduler]++
	}
	return n
}

// Issue 21: with NewLocker's defaults, a job every second ran 3 times in
// 15 s across three schedulers, its minimum hold of 5 s blocking the
// ticks in between. Three scheduler processes, started 300 ms apart, fire a
// job that takes 10 ms on every whole second for 10 s: each second runs it
// exactly once, though the schedulers' ticks coincide and the hold is longer
// than the interval.
func TestLocker_defaults_jobEverySecond(t *testing.T) {
	schedulersOnEachServer(t, "locker", "second", []time.Duration{0, 300 * time.Millisecond, 600 * time.Millisecond},
		10*time.Second, checkEverySecondAsked)
}

// The other side (gocron issue 841): a job every 5 s that takes 10 ms, on
// three scheduler processes started up to 1 s apart, so that their ticks
// for one interval are up to 1 s apart, still runs once per interval.
func TestLocker_defaults_splayedSchedulers(t *testing.T) {
	const interval, spread = 5 * time.Second, time.Second
	schedulersOnEachServer(t, "locker", "5s", []time.Duration{spread, 0, spread / 2}, 4*interval+spread+splaySlack+500*time.Millisecond,
		func(t *testing.T, runs []runRow, startAt, stopAt time.Time) {
			checkEveryInterval(t, runs, startAt, stopAt, interval, spread)
		})
}

// With the Elector only the leader's scheduler runs jobs: each second once.
func TestElector_jobEverySecond(t *testing.T) {
	schedulersOnEachServer(t, "elector", "second", []time.Duration{0, 0, 0}, 8*time.Second, checkEverySecondAsked)
}
