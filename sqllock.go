package sqllock

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/wait"
)

// Defaults and limits.
const (
	// DefaultTable is the table a Client uses unless [WithTable] says otherwise.
	DefaultTable = "sqllock"
	// MaxNameLen is the longest lock name, in bytes; longer ones are refused.
	MaxNameLen = 255
	// maxHolderLen is the longest holder description, in bytes.
	maxHolderLen = 255
	// MinTTL is the shortest lease.
	MinTTL = time.Millisecond
	// MaxTTL is the longest lease: a century, well inside DATETIME's range.
	MaxTTL = 100 * 365 * 24 * time.Hour
)

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
	budget    fault.Budget  // the resends' (internal/engine/exec.go); set by tests only (options.go)
	lockDelay time.Duration // WithLockDelay; negative: the default (admin.go)
	// releaseTimeout bounds a release's own context: ReleaseTimeout, but
	// for tests that only wait on it.
	releaseTimeout time.Duration

	reporter // its logger, Observer and warnings; observe.go

	eng *engine.Server // what the Client has learned of its server, its statements' forms; checks, proves, prepares and sends them

	// wait is the waiting calls' machinery: their queues, wake-up
	// channels, looks and bound (internal/wait); each kind's waiting
	// acquire waits in it (acquireCall.waitFor).
	wait    wait.Engine
	wakeups int  // WithWakeups
	oneLane bool // a semaphore's callers wait in one queue, as before lanes; for tests

	// mu guards the fields below it. It is never held across a call to
	// the server: a call stuck on a dead connection must not hold up
	// others, which wait only as long as their own contexts allow.
	mu           sync.Mutex
	closeStarted bool
	closeErr     error // Close's result, set before closeDone is closed

	closing   chan struct{} // closed when Close starts
	closeDone chan struct{} // closed when Close has finished

	renewals   renewals    // the keep-alives' shared renewal; renewal.go
	held       held        // the Locks to release on Close; held.go
	orphans    nameOrphans // tokens whose leases may be left on the server; held.go
	semOrphans semOrphans  // the same for semaphores' slots
}

// defaultWakeups is how many wake-up channels a Client holds at once unless
// [WithWakeups] says otherwise: the names it waits for beyond these poll.
const defaultWakeups = 4

// New returns a Client that keeps its leases in db's table (see
// [Client.CreateTable]). It sends nothing to the server.
func New(db *sql.DB, opts ...Option) (*Client, error) {
	if db == nil {
		return nil, errorf("nil *sql.DB")
	}
	c := &Client{
		db:             db,
		table:          "`" + DefaultTable + "`",
		holder:         defaultHolder(),
		retry:          ExponentialBackoff(defaultRetryMin, defaultRetryMax),
		closing:        make(chan struct{}),
		closeDone:      make(chan struct{}),
		reporter:       reporter{log: discardLogger},
		wakeups:        defaultWakeups,
		lockDelay:      -1,
		releaseTimeout: ReleaseTimeout,
	}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	c.holderArg = c.holder
	c.eng = c.newEngine()
	lanes := MaxSlots
	if c.oneLane {
		lanes = 1
	}
	c.wait.Init(wait.Config{
		DB:          db,
		Wakeups:     c.wakeups,
		MaxLanes:    lanes,
		SQL:         func(name string) string { return c.eng.Text().Named(name) },
		Log:         c.log,
		Woke:        c.wokeUp,
		Closing:     c.closing,
		Closed:      ErrClosed,
		NotAcquired: ErrNotAcquired,
		Passable:    passable,
		HeldBy:      heldError,
		Errorf:      errorf,
		Ahead:       c.eng.Ahead, // the table's check before a wait, when due soon
	})
	return c, nil
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	h := host + ":" + strconv.Itoa(os.Getpid())
	if len(h) > maxHolderLen {
		h = h[len(h)-maxHolderLen:]
	}
	return h
}

// CreateTable creates the Client's table from schema.sql if it does not
// exist, then checks it as a Client's first use does ([ErrBadTable]).
func (c *Client) CreateTable(ctx context.Context) error {
	if c.isClosed() {
		return ErrClosed
	}
	op := "create table " + c.table
	if _, err := c.db.ExecContext(ctx, c.eng.Text().Substitute(schema)); err != nil {
		return c.serverError(op, err)
	}
	// A table dropped again at once is no error: the next statement
	// checks anew.
	if err := c.eng.FirstUse(ctx); err != nil {
		return c.serverError(op, err)
	}
	return nil
}

// Close ends every keep-alive the Client runs and releases every lease it
// holds, giving the releases a few seconds in all, then closes its statements
// (not the *sql.DB). It returns the errors of releases that failed other than
// with [ErrNotHeld]; such a lease expires on its own. Later calls, and
// acquires that end after it started, return [ErrClosed].
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
	c.wait.Stop() // waits on wake-up channels end now, and looks

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	// The statements stay open until the leases are released.
	err := c.releaseHeld(ctx)
	c.releaseOrphans(ctx)
	c.renewals.closeSessions(ctx, c)
	c.wait.Close(ctx)
	c.eng.Close(ctx)
	c.closeErr = err
	close(c.closeDone)
	return err
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
