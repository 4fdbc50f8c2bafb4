package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults and limits.
const (
	// DefaultTable is the table a Client uses unless [WithTable] says otherwise.
	DefaultTable = "sqllock"
	// MaxNameLen is the longest lock name, in bytes: the width of the name
	// column. Longer names are refused, never truncated into one another.
	MaxNameLen = 255
	// MaxHolderLen is the longest holder description, in bytes.
	MaxHolderLen = 255
	// MinTTL is the shortest lease: the server keeps microseconds, but a
	// lease shorter than a round trip cannot be used.
	MinTTL = time.Millisecond
	// MaxTTL is the longest lease: a century, which keeps every expiry far
	// inside DATETIME's range (it ends in 9999) whatever the server's clock.
	MaxTTL = 100 * 365 * 24 * time.Hour
)

// cleanupTimeout bounds the DELETE that undoes an acquire whose outcome is
// unknown because the caller's context ended while it ran.
const cleanupTimeout = time.Second

// Statements of queries.sql, by index into Client.stmts.
const (
	qAcquire = iota
	qRefresh
	qRelease
	qInspect
	qReleaseAtLeast // do.go
	qCheck          // lease.go
	qList           // lease.go
	qOnceDone       // once.go
	qOnceRecord     // once.go
	qLease          // admin.go
	qOnceReset      // admin.go
	numStmts
)

var stmtNames = [numStmts]string{
	qAcquire: "acquire",
	qRefresh: "refresh",
	qRelease: "release",
	qInspect: "inspect",

	qReleaseAtLeast: "release_at_least",
	qCheck:          "check",
	qList:           "list",
	qOnceDone:       "once_done",
	qOnceRecord:     "once_record",
	qLease:          "lease",
	qOnceReset:      "once_reset",
}

// tidbPrefix names, in queries.sql, the statements that take the place of
// others on TiDB (tablecheck.go): a name has one row there.
const tidbPrefix = "tidb_"

// tidbStmts are the statements with a TiDB form; the rest serve TiDB as
// they are.
var tidbStmts = []int{qAcquire, qRefresh, qRelease, qInspect, qReleaseAtLeast, qList, qLease, qOnceRecord}

// maxTiDBFence is where fences end on TiDB: its LAST_INSERT_ID(expr) takes
// a signed 64-bit value, and a refresh sets the fence plus one. Fences start
// at the clock in microseconds (about 2^51) and grow by one per acquire.
const maxTiDBFence = math.MaxInt64 - 1

// tidbAcquireArgs is how many of the acquire's arguments TiDB's form takes:
// the first four, which both forms begin with (queries.sql).
const tidbAcquireArgs = 4

// A Client acquires leases on names in one table of one database. It is safe
// for concurrent use. Its statements are prepared on first use and kept
// until [Client.Close]; the *sql.DB stays the caller's.
type Client struct {
	db     *sql.DB
	table  string // backtick-quoted
	holder string
	// holderArg is holder boxed once: converting a string to any
	// allocates, and every acquire sends it twice.
	holderArg any
	retry     RetryStrategy
	log       *slog.Logger // logging.go

	sql   [numStmts]string // statement text with the table name in place; TiDB's from the first use on (under mu until then)
	tidb  atomic.Bool      // the server is TiDB: c.sql holds its forms (tablecheck.go)
	stmts [numStmts]atomic.Pointer[sql.Stmt]

	waiters waiters // Acquire calls waiting for a name (waiters.go)
	wake    wakeups // wake-up channels (wake.go)

	// mu guards the fields below it. It is never held across a call to
	// the server: a call stuck on a dead connection must not hold up
	// others, which wait only as long as their own contexts allow.
	mu           sync.Mutex
	checked      bool                     // the first-use check passed; tablecheck.go
	proven       bool                     // the proof of the statements passed; proof.go
	version      string                   // the server's, as the first-use check read it
	prepares     [numStmts]*prepareFlight // prepares under way
	closed       bool                     // the statements are closed; no more are prepared
	closeStarted bool
	closeErr     error // Close's result, set before closeDone is closed

	closing   chan struct{} // closed when Close starts
	closeDone chan struct{} // closed when Close has finished

	held    held    // the Locks to release on Close; lease.go
	orphans orphans // tokens of acquires whose outcome stays unknown; orphans.go
}

// A prepareFlight is one prepare of a statement under way. Every caller
// that needs the statement waits for it, each as long as its own context
// allows; st and err are set when done is closed.
type prepareFlight struct {
	done chan struct{}
	st   *sql.Stmt
	err  error
}

// An Option configures a Client in [New].
type Option func(*Client) error

// WithTable makes the Client use table name instead of [DefaultTable]. The
// name must match ^[A-Za-z0-9_]{1,64}$; it is quoted, never interpolated raw.
func WithTable(name string) Option {
	return func(c *Client) error {
		q, err := quoteTable(name)
		if err != nil {
			return err
		}
		c.table = q
		return nil
	}
}

// WithHolder sets the description of this Client stored with each lease it
// takes and shown by [Client.Inspect]; the default is "hostname:pid". It is
// for people reading the table: ownership is decided by a random token,
// never by this text.
func WithHolder(desc string) Option {
	return func(c *Client) error {
		if desc == "" {
			return errors.New("sqllock: empty holder description")
		}
		if len(desc) > MaxHolderLen {
			return fmt.Errorf("sqllock: holder description is %d bytes, longer than the %d the table holds", len(desc), MaxHolderLen)
		}
		c.holder = desc
		return nil
	}
}

// WithRetry sets how [Client.Acquire] waits between attempts. The default is
// ExponentialBackoff(DefaultRetryMin, DefaultRetryMax).
func WithRetry(s RetryStrategy) Option {
	return func(c *Client) error {
		if s == nil {
			return errors.New("sqllock: nil RetryStrategy")
		}
		c.retry = s
		return nil
	}
}

// New returns a Client that keeps its leases in db. It sends nothing to the
// server: the table is created by [Client.CreateTable] (or schema.sql run by
// hand), and statements are prepared on first use.
func New(db *sql.DB, opts ...Option) (*Client, error) {
	if db == nil {
		return nil, errors.New("sqllock: nil *sql.DB")
	}
	c := &Client{
		db:        db,
		table:     "`" + DefaultTable + "`",
		holder:    defaultHolder(),
		retry:     ExponentialBackoff(DefaultRetryMin, DefaultRetryMax),
		closing:   make(chan struct{}),
		closeDone: make(chan struct{}),
		log:       discardLogger,
	}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	for i, name := range stmtNames {
		c.sql[i] = c.substitute(queries[name])
	}
	c.holderArg = c.holder
	c.wake.init(c.table)
	return c, nil
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	h := host + ":" + strconv.Itoa(os.Getpid())
	if len(h) > MaxHolderLen {
		h = h[len(h)-MaxHolderLen:]
	}
	return h
}

// substitute puts the Client's quoted table name into a statement.
func (c *Client) substitute(stmt string) string {
	return strings.ReplaceAll(stmt, tablePlaceholder, c.table)
}

// CreateTable creates the Client's table if it does not exist, running the
// statement of schema.sql, and then makes the Client's first-use check: a
// table that was there already and differs from schema.sql gives an error
// wrapping [ErrBadTable], which says how to mend it.
func (c *Client) CreateTable(ctx context.Context) error {
	if c.isClosed() {
		return ErrClosed
	}
	op := "create table " + c.table
	if _, err := c.db.ExecContext(ctx, c.substitute(schema)); err != nil {
		return c.serverError(op, err)
	}
	c.mu.Lock()
	checked := c.checked
	c.mu.Unlock()
	if checked {
		if err := c.proveOnce(ctx); err != nil {
			return c.serverError(op, err)
		}
		return nil
	}
	found, err := c.checkFirstUse(ctx)
	if err != nil {
		return c.serverError(op, err)
	}
	c.mu.Lock()
	c.checked = c.checked || found
	c.mu.Unlock()
	if !found {
		return nil // dropped again at once; the next statement checks anew
	}
	if err := c.proveOnce(ctx); err != nil {
		return c.serverError(op, err)
	}
	return nil
}

// Close ends every keep-alive the Client runs and releases every lease it
// holds (see [Client.Held]), so that other replicas need not wait for them to
// expire; then it closes the statements the Client prepared. It does not
// close the *sql.DB. It returns the errors of releases that failed other than
// with [ErrNotHeld]; such a lease expires on its own. A lease acquired while
// Close runs is released at once, and its acquire returns [ErrClosed]. Calls
// after Close starts return [ErrClosed].
//
// Close makes one pass, however many goroutines call it: a call made while
// the pass runs, or after it, waits for it and returns its result. The pass
// gives the releases a few seconds in all; a release stuck on a dead
// connection is then abandoned, and its lease expires on its own.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closeStarted {
		c.mu.Unlock()
		<-c.closeDone
		return c.closeErr
	}
	c.closeStarted = true
	close(c.closing)
	c.mu.Unlock()
	c.wake.cancel() // waits on wake-up channels end now

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	// The statements stay open until the leases are released.
	err := c.releaseHeld(ctx)
	c.releaseOrphans(ctx)
	c.wake.closeAll(ctx)
	c.mu.Lock()
	c.closed = true // a prepare that ends from now on closes its statement
	c.mu.Unlock()
	c.closeStmts(ctx)
	c.closeErr = err
	close(c.closeDone)
	return err
}

// closeStmts closes the Client's statements. database/sql makes closing a
// statement wait for the executions of it under way, and one may hang on a
// dead connection until its context ends: so each statement is closed on a
// goroutine of its own, and closeStmts waits for them only until ctx ends.
// (Closing a *sql.Stmt that was prepared reports no error.)
func (c *Client) closeStmts(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range c.stmts {
		if st := c.stmts[i].Swap(nil); st != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = st.Close()
			}()
		}
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// isClosed reports whether Close has started.
func (c *Client) isClosed() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// stmtsClosed reports whether Close has closed the statements.
func (c *Client) stmtsClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// stmt returns statement i, preparing it on first use. The first use also
// makes the first-use check of the session, server and table (tablecheck.go). Callers that need a statement
// another caller is preparing wait for that prepare, as long as ctx allows;
// if the preparing caller's context ends first, a waiter prepares it anew.
func (c *Client) stmt(ctx context.Context, i int) (*sql.Stmt, error) {
	for {
		if st := c.stmts[i].Load(); st != nil {
			return st, nil
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		f := c.prepares[i]
		lead := f == nil
		if lead {
			f = &prepareFlight{done: make(chan struct{})}
			c.prepares[i] = f
		}
		c.mu.Unlock()
		if lead {
			c.prepare(ctx, i, f)
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.err != nil && !lead && isContextErr(f.err) {
			continue // the preparing caller gave up; ours is still live
		}
		return f.st, f.err
	}
}

// prepare runs the prepare flight f of statement i and publishes its result.
func (c *Client) prepare(ctx context.Context, i int, f *prepareFlight) {
	st, err := c.prepareStmt(ctx, i)
	c.mu.Lock()
	c.prepares[i] = nil
	closed := c.closed
	if err == nil && !closed {
		c.stmts[i].Store(st)
	}
	c.mu.Unlock()
	if err == nil && closed {
		// Close finished while this prepare ran: nobody else will close it.
		_ = st.Close()
		st, err = nil, ErrClosed
	}
	f.st, f.err = st, err
	close(f.done)
}

// prepareStmt makes the first-use check (tablecheck.go), until it has found
// the table as it should be, and prepares statement i.
func (c *Client) prepareStmt(ctx context.Context, i int) (*sql.Stmt, error) {
	c.mu.Lock()
	checked := c.checked
	c.mu.Unlock()
	if !checked {
		found, err := c.checkFirstUse(ctx)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.checked = found
		c.mu.Unlock()
		checked = found
	}
	if checked && writes(i) {
		if err := c.proveOnce(ctx); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	text := c.sql[i] // a first-use check of another call may be choosing the forms
	c.mu.Unlock()
	var st *sql.Stmt
	err := retryTransient(ctx, func() (err error) {
		st, err = c.db.PrepareContext(ctx, text)
		return err
	})
	if err != nil {
		if isConnectError(err) {
			return nil, err
		}
		return nil, fmt.Errorf("prepare: %w", err)
	}
	return st, nil
}

// ctxErr is ctx.Err, and DeadlineExceeded once ctx's deadline has passed
// though ctx has not yet ended: a dial or a read cut by that deadline fails
// with a timeout of its own a moment before ctx's timer fires.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// retryTransient runs f, which changes nothing on the server (a prepare, a
// read), again while it fails with a broken connection or a rollback, as
// retry does.
func retryTransient(ctx context.Context, f func() error) error {
	return retry(ctx, time.Time{}, f)
}

// retry runs f again while it fails in a way the same statement may get
// past at once: a rollback (deadlock, lock wait timeout, cluster
// certification conflict) until the budget ends, a broken connection up to
// maxTransientAttempts times. The budget ends at ctx's deadline, at until
// if that is sooner and set, and at the latest maxRetryBudget from now; a
// pause that would end past it is not taken. A refusal (a read-only
// server, no server) is returned at once: a failover outlasts any pause
// here, and the loops that keep trying (Acquire, Elect, the keep-alive)
// pace themselves.
func retry(ctx context.Context, until time.Time, f func() error) error {
	budget := time.Now().Add(maxRetryBudget)
	if d, ok := ctx.Deadline(); ok && d.Before(budget) {
		budget = d
	}
	if !until.IsZero() && until.Before(budget) {
		budget = until
	}
	broken := 0
	var last error // of the attempt before, for when ctx cuts this one
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return nil
		}
		switch classify(err) {
		case failedFinal, failedRefused:
			if last != nil && ctx.Err() != nil {
				return fmt.Errorf("%w (last error: %w)", err, last)
			}
			return err
		case failedUnknown:
			if broken++; broken >= maxTransientAttempts {
				return err
			}
		}
		wait := transientBackoff(attempt)
		if time.Now().Add(wait).After(budget) {
			return err
		}
		if werr := sleepCtx(ctx, wait); werr != nil {
			return fmt.Errorf("%w (last error: %w)", werr, err)
		}
		last = err
	}
}

var errAutocommitOff = errors.New("the session has autocommit off (a DSN's autocommit=0 or the server's default); sqllock's statements must commit on their own")

// serverError wraps an error from preparing or running a statement with the
// operation, once, and says how to mend a missing or foreign table.
func (c *Client) serverError(op string, err error) error {
	if errors.Is(err, ErrClosed) {
		return err
	}
	if c.stmtsClosed() {
		// Close closed the statement under this call: database/sql says
		// "sql: statement is closed", which is ErrClosed, as exec says.
		return ErrClosed
	}
	if n, ok := serverErrno(err); ok {
		switch n {
		case erNoSuchTable:
			return errorf("%s: table %s does not exist; create it with Client.CreateTable or by running schema.sql: %w", op, c.table, err)
		case erBadField:
			return errorf("%s: table %s does not have the columns of schema.sql (another tool's table, or one made by hand?): %w", op, c.table, err)
		}
	}
	if isConnectError(err) {
		return errorf("%s: connect to the server: %w", op, err)
	}
	return errorf("%s: %w", op, err)
}

// exec runs statement i, retrying it (see retry) while the server rolls it
// back (deadlock, lock wait timeout, cluster conflict) or the connection
// breaks before the reply. The caller's arguments carry its
// token, so a retry gives the answer the first attempt would have.
// maybeApplied reports whether an attempt that failed may have committed.
func (c *Client) exec(ctx context.Context, i int, args ...any) (res sql.Result, maybeApplied bool, err error) {
	return c.execUntil(ctx, time.Time{}, i, args...)
}

// execUntil is exec whose retries of a rolled-back statement also end at
// until, when it is set: a refresh's retries end when the lease could.
func (c *Client) execUntil(ctx context.Context, until time.Time, i int, args ...any) (res sql.Result, maybeApplied bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err // nothing sent, nothing to clean up
	}
	st, err := c.stmt(ctx, i)
	if err != nil {
		return nil, false, err
	}
	if i == qAcquire && c.tidb.Load() {
		args = args[:tidbAcquireArgs]
	}
	err = retry(ctx, until, func() error {
		var err error
		if res, err = st.ExecContext(ctx, args...); err == nil {
			return nil
		}
		switch classify(err) {
		case failedUnknown:
			maybeApplied = true
			c.logRetry(ctx, stmtNames[i], args, err)
		case failedRolledBack:
			c.logRetry(ctx, stmtNames[i], args, err)
		case failedFinal:
			if ctx.Err() != nil {
				// A context that ended while the statement was on its
				// way made the driver cut the connection: the outcome
				// is unknown. (Never reset: an earlier attempt may also
				// have been applied.)
				maybeApplied = true
			}
		}
		if c.stmtsClosed() {
			return ErrClosed // "sql: statement is closed", or a retry would say so
		}
		return err
	})
	if err != nil {
		return nil, maybeApplied, err
	}
	return res, maybeApplied, nil
}

// maxTransientBackoff caps the pause between attempts of one statement.
const maxTransientBackoff = 64 * time.Millisecond

// transientBackoff is the pause before sending a rolled-back or cut
// statement again: from about a millisecond, doubling up to
// maxTransientBackoff, each drawn at random from the upper half of its step,
// so that writers that conflicted (two sides of a deadlock, writers on
// several cluster nodes) spread out instead of colliding again.
func transientBackoff(attempt int) time.Duration {
	d := maxTransientBackoff
	if attempt < 7 {
		d = min(time.Millisecond<<attempt, d)
	}
	return d/2 + rand.N(d/2+1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkName returns an error naming what is wrong with a lock name.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("sqllock: empty lock name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("sqllock: lock name is %d bytes, longer than the %d the table holds", len(name), MaxNameLen)
	}
	return nil
}

// checkTTL returns an error naming what is wrong with a lease length.
func checkTTL(ttl time.Duration) error {
	switch {
	case ttl < MinTTL:
		return fmt.Errorf("sqllock: ttl %v is below the minimum %v", ttl, MinTTL)
	case ttl > MaxTTL:
		return fmt.Errorf("sqllock: ttl %v is beyond the maximum %v", ttl, MaxTTL)
	}
	return nil
}

// acquireToken checks an acquire's arguments, before anything is sent, and
// draws the owner token for it.
func acquireToken(name string, ttl time.Duration) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if err := checkTTL(ttl); err != nil {
		return "", err
	}
	token, err := newToken()
	if err != nil {
		return "", fmt.Errorf("sqllock: token: %w", err)
	}
	return token, nil
}

// TryAcquire makes one attempt to take the lease on name for ttl, measured by
// the server's clock. It succeeds when the name is free, when its lease has
// expired (whoever held it), and returns an error wrapping [ErrNotAcquired]
// when another owner's lease is live. Each call draws a fresh random owner
// token. The attempt is one statement. When the server rolls it back (a
// deadlock, a cluster certification conflict) it is sent again with the same
// token, with jittered pauses, until ctx's deadline (at most 5s on); a broken
// connection is retried a few times. A server that refuses it (read-only, no
// server listening) applied nothing, and its error comes back at once.
//
// When the outcome stays unknown (the connection broke after the statement
// was sent, or ctx ended while it ran), the acquire deletes the lease it may
// have taken; if that fails too, the Client remembers the token, and its next
// acquire of name, or Close, deletes that lease first, so that the name is
// not blocked for ttl by a lease nobody holds.
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lock, error) {
	token, err := acquireToken(name, ttl)
	if err != nil {
		return nil, err
	}
	return c.acquireOnce(ctx, name, ttl, token)
}

// acquireOnce is one attempt of an acquire call with token, which the call
// then abandons if it failed.
func (c *Client) acquireOnce(ctx context.Context, name string, ttl time.Duration, token string) (*Lock, error) {
	var u unsettled
	l, err := c.tryAcquire(ctx, name, ttl, token, &u)
	if l == nil {
		c.abandon(name, token, &u)
	}
	return l, err
}

// unsettled records the attempts of one acquire call, all with its one
// token, whose outcome stayed unknown and whose cleanup did not settle them.
type unsettled struct {
	ttl  time.Duration // the longest such attempt's
	sent time.Time     // the latest such attempt's send time; zero for none
}

// abandon gives up token, of an acquire call that returns without a Lock:
// from now on nobody holds it, so the lease an unsettled attempt may leave
// under it is the Client's to delete before its next acquire of name, or at
// Close (orphans.go). A token is remembered only once its call has ended:
// while the call goes on, its next attempt may take the lease under that
// token, and a DELETE by the token would take it from the Lock it returns.
func (c *Client) abandon(name, token string, u *unsettled) {
	if u.sent.IsZero() {
		return
	}
	c.log.Warn("sqllock: an acquire's outcome stays unknown; its lease, if any, is deleted before this Client's next acquire of the name", "name", name)
	c.orphans.remember(name, token, u.ttl, u.sent)
}

// tryAcquire makes one attempt with token, and records in u an attempt whose
// outcome stays unknown.
func (c *Client) tryAcquire(ctx context.Context, name string, ttl time.Duration, token string, u *unsettled) (*Lock, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	// Leases earlier acquires of name may have left under tokens nobody
	// holds go first; without any, this costs an atomic load.
	c.claimOrphans(ctx, name)
	// Each argument is boxed once (a string or an int64 converted to any
	// allocates), and the Lock, made first, keeps name and token boxed for
	// Refresh and Release: the statements use them several times.
	l := newLock(c, name, token, 0, ttl, time.Time{})
	nameArg, tokenArg := l.keyArgs()
	us := any(ttl.Microseconds())
	sent := time.Now()
	res, maybeApplied, err := c.exec(ctx, qAcquire,
		nameArg, tokenArg, c.holderArg, us, nameArg,
		tokenArg, c.holderArg, tokenArg, us)
	if err != nil {
		if maybeApplied {
			// The lease may be ours under a token nobody will ever use
			// again; give the name back rather than block it for ttl.
			c.cleanup(ctx, name, token, ttl, sent, u)
		}
		if cerr := ctxErr(ctx); cerr != nil {
			if errors.Is(err, cerr) {
				return nil, errorf("acquire %q: %w: %w", name, ErrNotAcquired, err)
			}
			return nil, errorf("acquire %q: %w: %w (last error: %w)", name, ErrNotAcquired, cerr, err)
		}
		return nil, c.serverError(fmt.Sprintf("acquire %q", name), err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return nil, fmt.Errorf("sqllock: acquire %q: %w", name, err)
	}
	// The OK packet carries the insert id unsigned; the driver hands it
	// over as an int64, negative from 2^63 on.
	fence := uint64(id)
	switch {
	case fence == 0:
		return nil, fmt.Errorf("%w: %q is held by another owner", ErrNotAcquired, name)
	case fence <= 2:
		// The lease row's mark came through: the fence row was missing
		// while the lease was ours, which only a hand-made change can do.
		// The lease is ours, under a token nobody will use: give it back.
		c.cleanup(ctx, name, token, ttl, sent, u)
		return nil, fmt.Errorf("sqllock: acquire %q: the fence row is missing (mark %d); the table was changed by hand", name, fence)
	case fence > maxTiDBFence && c.tidb.Load():
		// TiDB's LAST_INSERT_ID(expr) takes a signed value: past it, the
		// acquire fails (1690), or under a lenient sql_mode reports the
		// largest signed value, which may be below the fence it wrote.
		c.cleanup(ctx, name, token, ttl, sent, u)
		return nil, fmt.Errorf("sqllock: acquire %q: the fence reached TiDB's largest, %d", name, uint64(maxTiDBFence))
	}
	l.fence, l.validUntil = fence, sent.Add(ttl)
	if !c.held.add(l) {
		// Close is releasing this Client's leases and has missed this one.
		c.cleanup(ctx, name, token, ttl, sent, u)
		return nil, ErrClosed
	}
	return l, nil
}

// cleanup deletes the row an acquire of name for ttl, sent at sent, may have
// written (its outcome is unknown, or it lost the race with Close), with a
// context of its own: the caller's may have ended. When that does not settle
// it (see orphans.go), it records the attempt in u.
func (c *Client) cleanup(ctx context.Context, name, token string, ttl time.Duration, sent time.Time, u *unsettled) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if !c.deleteOrphan(ctx, name, orphan{token: token, settled: sent.Add(orphanWait)}) {
		u.ttl = max(u.ttl, ttl)
		u.sent = maxTime(u.sent, sent)
	}
}

// Acquire takes the lease on name for ttl like [Client.TryAcquire], waiting
// between attempts as the Client's [RetryStrategy] says, until it succeeds,
// the strategy gives up, or ctx ends. When ctx ends first, the error
// satisfies both errors.Is(err, ErrNotAcquired) and errors.Is(err, ctx.Err()).
// One token serves all the attempts of one call.
//
// Calls of one Client waiting for the same name queue up and share one
// poller: only the first in line sends statements, so a thousand waiting
// goroutines load the server like one. Each statement it sends counts as an
// attempt of every call in the queue when the answer comes, for the
// strategy's count. An error that may pass (a failover's read-only server,
// a restart, too many connections) counts as a refused attempt too; when the
// strategy gives up, or ctx ends, the error wraps the last such error. Other
// errors (a missing table, a refused login) end the call at once. A
// [Lock.Release] of the name in the same Client, or a
// [Lock.Refresh] that finds its lease lost, makes the first in line try at
// once, without waiting for its next poll. Callers in other Clients (other
// processes) learn of a release only when they poll: within the strategy's
// longest wait; with [WithWakeups], the release wakes the process that has
// waited longest at once, and a waiting process does not poll.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lock, error) {
	token, err := acquireToken(name, ttl)
	if err != nil {
		return nil, err
	}
	if _, ok := c.retry.Backoff(1); !ok {
		// A strategy that never retries makes Acquire a TryAcquire; a
		// queue would only delay its one answer.
		return c.acquireOnce(ctx, name, ttl, token)
	}
	return c.acquireQueued(ctx, name, ttl, token)
}

// Info describes the lease on one name as the server sees it.
type Info struct {
	Name string
	// Holder is the description of the Client whose lease is on the name
	// (see [WithHolder]), live or expired; empty once it was released.
	Holder string
	// Fence is the last fencing token issued for the name, kept across
	// releases; 0 when the name was never taken.
	Fence uint64
	// Held reports whether a lease on the name is live now.
	Held bool
	// TTL is how long the live lease has left by the server's clock; 0 when
	// Held is false.
	TTL time.Duration
}

// Inspect reads the lease on name in one statement. A name nobody holds
// comes back with Held false and no error.
func (c *Client) Inspect(ctx context.Context, name string) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	st, err := c.stmt(ctx, qInspect)
	if err != nil {
		return Info{}, c.serverError(fmt.Sprintf("inspect %q", name), err)
	}
	info := Info{Name: name}
	var (
		holder sql.NullString
		held   sql.NullBool
		us     sql.NullInt64
	)
	err = st.QueryRowContext(ctx, name).Scan(&holder, &info.Fence, &held, &us)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return info, nil
	case err != nil:
		return Info{}, c.serverError(fmt.Sprintf("inspect %q", name), err)
	}
	info.Holder = holder.String
	info.Held = held.Bool
	if info.Held {
		info.TTL = time.Duration(us.Int64) * time.Microsecond
	}
	return info, nil
}

// A Lock is a lease on one name, taken by [Client.TryAcquire] or
// [Client.Acquire]. Its methods are safe for concurrent use.
type Lock struct {
	c     *Client
	name  string
	token string
	fence uint64
	ttl   time.Duration // of the acquire; what the keep-alive renews for

	nameArg, tokenArg any // name and token boxed once, as statement arguments

	// refreshing holds a token while a Refresh runs: one at a time, so that
	// validUntil follows the server, and a Refresh waiting for another
	// gives up when its context ends.
	refreshing chan struct{}

	mu sync.Mutex
	// validUntil is when the lease could expire at the earliest, on this
	// process's monotonic clock: the send time of the last statement that
	// set the expiry, plus its ttl. The server computed the expiry from a
	// later instant, so the lease is ours at least until then.
	validUntil time.Time
	released   bool
	// endCause is set when the first release starts (by Release, Do's end
	// or Close), before its statement is sent: from then on no keep-alive
	// runs, and a KeepAlive's context ends with it at once.
	endCause error
	// releasing is the release under way, which other release calls wait
	// for and share the result of.
	releasing *releaseFlight
	// releaseUnknown: a Release failed in a way that may have deleted the row.
	releaseUnknown bool
	// wake: the Lock holds its name's wake-up channel, which its release
	// lets go of (wake.go). contended: its Acquire waited for the name.
	// probe: its release asks whether another process waits (wake.go).
	// Close may release the Lock before its Acquire has set them. They sit
	// in releaseUnknown's padding, so that a Lock stays in its allocation
	// size class.
	wake, contended, probe bool
	ka                     *keepAlive // started by the first KeepAlive; keepalive.go
}

// A releaseFlight is one release of a Lock under way; err is set when done
// is closed.
type releaseFlight struct {
	done chan struct{}
	err  error
}

// Name returns the name the lease is on.
func (l *Lock) Name() string { return l.name }

// Token returns the random owner token that identifies this lease.
func (l *Lock) Token() string { return l.token }

// Fence returns the lease's fencing token. Fences of one name grow strictly
// with every new holder, across takeovers of expired leases and across
// release and re-acquire, so a store that remembers the highest fence it
// has seen can refuse a write from a holder that lost its lease. A Refresh
// keeps the fence.
func (l *Lock) Fence() uint64 { return l.fence }

// ValidUntil returns the instant, on this process's monotonic clock, before
// which the lease cannot have expired: the send time of the acquire or the
// last successful Refresh, plus its ttl. It assumes the client's and the
// server's clocks run at the same rate, not that they agree.
func (l *Lock) ValidUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Refresh extends the lease to ttl from the server's now, in one statement,
// if it is still ours and has not expired. It returns an error wrapping
// [ErrNotHeld] when the lease is gone; any other error (network, server,
// context) means the outcome is unknown, not that the lease is lost, and
// Refresh may be called again. Refreshes of one Lock run one at a time; one
// waiting for another gives up when ctx ends. A keep-alive follows the lease
// a Refresh leaves: see [Lock.KeepAlive].
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := checkTTL(ttl); err != nil {
		return err
	}
	l.mu.Lock()
	released := l.released
	l.mu.Unlock()
	if released {
		return l.releasedErr()
	}
	select {
	case l.refreshing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("sqllock: refresh %q: %w", l.name, ctx.Err())
	}
	defer func() { <-l.refreshing }()
	sent := time.Now()
	name, token := l.keyArgs()
	res, _, err := l.c.execUntil(ctx, l.ValidUntil(), qRefresh, ttl.Microseconds(), name, token)
	if err != nil {
		// The refresh may have been applied; if it shortened the lease,
		// the shorter bound is the one to trust.
		l.mu.Lock()
		l.setValidUntil(minTime(l.validUntil, sent.Add(ttl)))
		l.mu.Unlock()
		return l.c.serverError(fmt.Sprintf("refresh %q", l.name), err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return fmt.Errorf("sqllock: refresh %q: %w", l.name, err)
	}
	if id == 0 {
		// The lease lapsed: the name may be free for a caller waiting in
		// this Client.
		l.c.waiters.kick(l.name)
		return fmt.Errorf("%w: the lease on %q expired or was taken over", ErrNotHeld, l.name)
	}
	l.mu.Lock()
	l.setValidUntil(sent.Add(ttl))
	l.mu.Unlock()
	return nil
}

// Release deletes the lease, in one statement guarded by the token, so it
// never removes another owner's lease. It returns an error wrapping
// [ErrNotHeld] when the row is no longer ours: the lease expired and someone
// took the name over (so the work done under it may have overlapped theirs),
// or the Lock was already released. A lease that expired but that nobody
// took is released without error: nobody else held the name in between.
// After any other error the outcome is unknown and Release may be called
// again. First it stops the Lock's keep-alive, if one runs, ending its
// contexts (see [Lock.KeepAlive]) and waiting for its goroutine to exit. A
// Release called while another release of the Lock runs (another Release,
// or [Client.Close]) sends nothing: it waits for that one, as long as ctx
// allows, and returns its result.
func (l *Lock) Release(ctx context.Context) error {
	return l.release(ctx, 0, nil)
}

// release ends the Lock's keep-alive, if it runs, with cause (nil: the Lock
// was released), then ends the lease: it deletes the row, or with minHold > 0
// keeps it until acquired_at + minHold (do.go). It reports the outcome as
// Release does. A call made while another runs waits for it, as long as ctx
// allows, and returns its result.
func (l *Lock) release(ctx context.Context, minHold time.Duration, cause error) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return l.releasedErr()
	}
	if f := l.releasing; f != nil {
		l.mu.Unlock()
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return fmt.Errorf("sqllock: release %q: %w", l.name, ctx.Err())
		}
	}
	f := &releaseFlight{done: make(chan struct{})}
	l.releasing = f
	if l.endCause == nil {
		if cause == nil {
			cause = l.releasedErr()
		}
		l.endCause = cause
	}
	ka := l.ka
	l.mu.Unlock()

	// Before the statement: a renewal racing the delete would report loss,
	// and a keep-alive's context must not outlive the lease.
	l.stopKeepAlive(ka)
	err := l.sendRelease(ctx, minHold)
	l.mu.Lock()
	l.releasing = nil
	l.mu.Unlock()
	f.err = err
	close(f.done)
	return err
}

// sendRelease sends the statement that ends the lease and reports the outcome as
// Release does.
func (l *Lock) sendRelease(ctx context.Context, minHold time.Duration) error {
	var (
		ours         bool
		maybeApplied bool
		err          error
	)
	if minHold > 0 {
		ours, maybeApplied, err = l.releaseAtLeast(ctx, minHold)
	} else {
		var res sql.Result
		name, token := l.keyArgs()
		if res, maybeApplied, err = l.c.exec(ctx, qRelease, name, token); err == nil {
			var n int64
			n, err = res.RowsAffected()
			ours = n == 1
		}
	}
	done := time.Now()
	if l.c.wake.on {
		l.afterRelease(ctx, err == nil)
	}
	if err != nil {
		if maybeApplied {
			l.mu.Lock()
			l.releaseUnknown = true
			l.mu.Unlock()
		}
		return l.c.serverError(fmt.Sprintf("release %q", l.name), err)
	}
	defer l.c.held.remove(l)
	// Whatever the answer, the lease is no longer ours: a caller waiting
	// for the name in this Client should try now.
	l.c.waiters.kick(l.name)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	if ours {
		return nil
	}
	// No row was ours. If an earlier attempt may have deleted it and this
	// reply came while the lease was certainly still live, nobody can have
	// taken it over: that earlier attempt did delete it.
	if (maybeApplied || l.releaseUnknown) && done.Before(l.validUntil) {
		return nil
	}
	return fmt.Errorf("%w: the lease on %q expired and was taken over", ErrNotHeld, l.name)
}

// afterRelease does what the wake-up channels (wake.go) ask after the
// release statement of l, which reached the server when ok.
func (l *Lock) afterRelease(ctx context.Context, ok bool) {
	l.mu.Lock()
	contended, wake, probe := l.contended, l.wake, l.probe && ok
	l.wake, l.probe = false, l.probe && !probe
	l.mu.Unlock()
	if contended {
		l.c.wake.waited(l.name) // this Client's next Acquire queues behind the others
	}
	if wake {
		// Right after the statement, whatever its outcome: the channel
		// wakes the next process, whose acquire decides.
		l.c.letGo(ctx, l.name, l)
	}
	if probe {
		l.c.probe(ctx, l.name)
	}
}

// newLock returns the Lock for a lease just acquired.
func newLock(c *Client, name, token string, fence uint64, ttl time.Duration, validUntil time.Time) *Lock {
	return &Lock{c: c, name: name, token: token, fence: fence, ttl: ttl, validUntil: validUntil,
		nameArg: name, tokenArg: token, refreshing: make(chan struct{}, 1)}
}

// keyArgs returns the name and token as statement arguments, boxed once
// when the Lock was made.
func (l *Lock) keyArgs() (name, token any) { return l.nameArg, l.tokenArg }

// releasedErr is the error of a call on a released Lock.
func (l *Lock) releasedErr() error {
	err := fmt.Errorf("%w: %q was already released", ErrNotHeld, l.name)
	if l.c.isClosed() {
		return errorf("%w: %w", ErrClosed, err)
	}
	return err
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
