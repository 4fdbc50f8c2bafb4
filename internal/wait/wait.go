// Package wait is the machinery a Client's waiting acquires share, whatever
// kind of lease they wait for (one name, a set, a slot of a semaphore):
//
//   - Queues (queue.go): the callers of one Client waiting for one key form
//     a queue in arrival order, and only its head sends statements, so a
//     thousand waiting goroutines load the server like one.
//   - Channels (channel.go): a key's wake-up channel, a server named lock
//     (GET_LOCK) beside the lease, hands the key from one process to the
//     next without polling, in the order they came.
//   - Looks (look.go): heads of many single names ask whether their names
//     are free in one statement, instead of each sending its acquire.
//   - Bound (look.go): the acquire statements of waiting calls under way at
//     once.
//
// It knows nothing of leases, tokens or the statements that take them: the
// caller's wait loop (the root package's wait.go) decides what a refusal
// is and what an attempt sends. A key names a queue and its channel; the
// caller chooses keys so that no two kinds of lease share one. Nothing here
// decides who holds a lease: a channel only says when to look again.
package wait

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"log/slog"
	"time"
)

// A Strategy says how long a waiting call waits after its attempt-th
// refused attempt, and false when it gives up (the root package's
// RetryStrategy).
type Strategy interface {
	Backoff(attempt int) (wait time.Duration, ok bool)
}

// boundKey marks a context whose deadline bounds even what Anyway runs: a
// release's, which must end within its ReleaseTimeout, its channel's
// let-go included.
type boundKey struct{}

// Bounded returns ctx marked so that Anyway keeps to its deadline.
func Bounded(ctx context.Context) context.Context {
	return context.WithValue(ctx, boundKey{}, true)
}

// Anyway returns a context for what must be done whatever ctx's end: ctx's
// values, ending after d; before, at ctx's deadline, when ctx is Bounded.
// A let-go cut short by it discards the connection, with which the server
// named lock dies.
func Anyway(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && ctx.Value(boundKey{}) != nil && time.Until(dl) < d {
		return context.WithDeadline(context.WithoutCancel(ctx), dl)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// discardConn closes conn's connection instead of giving it back to the
// pool: the named lock it may hold dies with it.
func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// An Engine is one Client's waiting machinery. Init readies it; Stop, then
// Close, end it.
type Engine struct {
	Queues   Queues
	Channels Channels
	Looks    Looks
	attempts chan struct{} // slots for the waiting calls' acquire statements
}

// Config is what an Engine needs of its Client.
type Config struct {
	DB *sql.DB
	// Wakeups is how many wake-up channels the Client holds at once; 0
	// turns them off.
	Wakeups int
	// SQL returns a statement of queries.sql by name, as the Client sends
	// it now, with its table and database in place: wake_wait,
	// wake_release and wake_probe (the channel's wait, release and probe)
	// and look (whose one ? stands for the names' literals). It is asked at
	// each send: the first use finds the table's database after Init.
	SQL func(name string) string
	Log *slog.Logger
	// Woke is told of each wait on a channel that ended in Granted,
	// TimedOut or Failed, with the key and how long it waited, and once of
	// the channels turning off (Off, with no key). It runs on the waiting
	// goroutine.
	Woke func(key string, st State, wait time.Duration)
	// Closing is closed when the Client's Close starts; Closed is what a
	// wait that Close ends returns.
	Closing <-chan struct{}
	Closed  error
}

// Init readies e for cfg.
func (e *Engine) Init(cfg Config) {
	e.attempts = make(chan struct{}, maxWaitingAttempts)
	e.Queues.closing, e.Queues.closed = cfg.Closing, cfg.Closed
	ws := &e.Channels
	ws.max, ws.on = cfg.Wakeups, cfg.Wakeups > 0
	ws.db, ws.log, ws.told, ws.closedErr = cfg.DB, cfg.Log, cfg.Woke, cfg.Closed
	ws.sql = cfg.SQL
	ws.stop, ws.cancel = context.WithCancel(context.Background())
	lk := &e.Looks
	lk.db, lk.sql, lk.stop = cfg.DB, cfg.SQL, ws.stop
	lk.closing, lk.closedErr = cfg.Closing, cfg.Closed
}

// Stop ends every wait on a channel and every look at once: Close's first
// step, before its releases.
func (e *Engine) Stop() {
	e.Channels.Stop()
	e.Looks.Close()
}
