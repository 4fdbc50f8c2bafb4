// Package wait is the machinery a Client's waiting acquires share, whatever
// kind of lease they wait for (one name, a set, a slot of a semaphore):
//
//   - The queues (queue.go): the callers of one Client waiting for one key form
//     a queue in arrival order, and only its head sends statements, so a
//     thousand waiting goroutines load the server like one.
//   - The channels (channel.go): a key's wake-up channel, a server named lock
//     (GET_LOCK) beside the lease, hands the key from one process to the
//     next without polling, in the order they came; a lease keeps its
//     Hold of it (hold.go), and a semaphore's slots wait in lanes
//     (lanes.go).
//   - The looks (look.go): heads of many single names ask whether their names
//     are free in one statement, instead of each sending its acquire.
//   - The bound (look.go): the acquire statements of waiting calls under way at
//     once.
//
// A waiting acquire is one call, Engine.Acquire (acquire.go). It knows
// nothing of leases, tokens or the statements that take them: the caller's
// Call decides what an attempt sends, and Config what a refusal is. A key
// names a queue and its channel; the caller chooses keys so that no two
// kinds of lease share one. Nothing here decides who holds a lease: a
// channel only says when to look again.
package wait

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"log/slog"
	"time"

	"github.com/sqllock/sqllock/observe"
)

// A strategy says how long a waiting call waits after its attempt-th
// refused attempt, and false when it gives up: a Call's Backoff, the
// Client's RetryStrategy.
type strategy interface {
	Backoff(attempt int) (wait time.Duration, ok bool)
}

// boundKey marks a context whose deadline bounds even what Anyway runs: a
// release's, which must end within its ReleaseTimeout, its channel's
// let-go included.
type boundKey struct{}

// bounded returns ctx marked so that Anyway keeps to its deadline.
func bounded(ctx context.Context) context.Context {
	return context.WithValue(ctx, boundKey{}, true)
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
	queues   queueSet
	channels channelSet
	looks    looker
	attempts chan struct{} // slots for the waiting calls' acquire statements

	// What Config says of refusals and errors (Config's fields of the
	// same names).
	notAcquired, closed error
	passable            func(error) bool
	heldBy              func(name string) error
	errorf              func(format string, args ...any) error
	ahead               func(ctx context.Context)
	maxLanes            int
}

// Config is what an Engine needs of its Client.
type Config struct {
	DB *sql.DB
	// Wakeups is how many wake-up channels the Client holds at once; 0
	// turns them off. MaxLanes bounds a semaphore's lanes (lanes.go).
	Wakeups, MaxLanes int
	// SQL returns a statement of queries.sql by name, as the Client sends
	// it now, with its table and database in place: wake_wait,
	// wake_release and wake_probe (the channel's wait, release and probe)
	// and look (whose one ? stands for the names' literals). It is asked at
	// each send: the first use finds the table's database after Init.
	SQL func(name string) string
	Log *slog.Logger
	// Woke is told of each wait on a channel that ended granted, timed out
	// or failed, with the call's label and how long it waited, and once of
	// the channels turning off (with no label). It runs on the waiting
	// goroutine.
	Woke func(label string, st observe.WakeupState, wait time.Duration)
	// Closing is closed when the Client's Close starts; Closed is what a
	// wait that Close ends returns.
	Closing <-chan struct{}
	Closed  error
	// NotAcquired is what a refused attempt's error wraps; Passable says
	// whether another error may pass (a failover), and so counts as a
	// refused attempt; HeldBy is the refusal of a name a look found held;
	// Errorf makes the calls' errors.
	NotAcquired error
	Passable    func(error) bool
	HeldBy      func(name string) error
	Errorf      func(format string, args ...any) error
	// Ahead runs before a head waits on a channel (the table's recheck).
	Ahead func(ctx context.Context)
}

// Init readies e for cfg.
func (e *Engine) Init(cfg Config) {
	e.attempts = make(chan struct{}, maxWaitingAttempts)
	e.notAcquired, e.closed, e.passable, e.heldBy, e.errorf = cfg.NotAcquired, cfg.Closed, cfg.Passable, cfg.HeldBy, cfg.Errorf
	e.ahead, e.maxLanes = cfg.Ahead, cfg.MaxLanes
	e.queues.closing, e.queues.closed = cfg.Closing, cfg.Closed
	ws := &e.channels
	ws.max, ws.on = cfg.Wakeups, cfg.Wakeups > 0
	ws.db, ws.log, ws.closedErr = cfg.DB, cfg.Log, cfg.Closed
	ws.told = func(label string, st state, d time.Duration) {
		if cfg.Woke == nil {
			return
		}
		switch st {
		case stGranted:
			cfg.Woke(label, observe.WakeupGranted, d)
		case stTimedOut:
			cfg.Woke(label, observe.WakeupTimedOut, d)
		case stFailed:
			cfg.Woke(label, observe.WakeupFailed, d)
		case stOff:
			cfg.Woke("", observe.WakeupOff, 0)
		}
	}
	ws.sql = cfg.SQL
	ws.stop, ws.cancel = context.WithCancel(context.Background())
	lk := &e.looks
	lk.db, lk.sql, lk.stop = cfg.DB, cfg.SQL, ws.stop
	lk.closing, lk.closedErr = cfg.Closing, cfg.Closed
}

// Stop ends every wait on a channel and every look at once: Close's first
// step, before its releases.
func (e *Engine) Stop() {
	e.channels.halt()
	e.looks.close()
}

// Close lets go of every channel, after Stop: Close's last step for them.
func (e *Engine) Close(ctx context.Context) { e.channels.closeAll(ctx) }

// Kick tells the callers waiting for key in this Client that its lease was
// released or lost here: the head tries at once.
func (e *Engine) Kick(key string) { e.queues.kick(key) }

// Waiting reports whether any caller of this Client waits, for any key.
func (e *Engine) Waiting() bool { return e.queues.keys() > 0 }

// Refuse turns the channels off for good, without a word: the server is
// known to refuse GET_LOCK.
func (e *Engine) Refuse() { e.channels.refused.Store(true) }

// Holders sends the look statement for in, the names' literals joined by
// commas, and returns those a live lease holds, by the server's clock (a
// refused set says so which of its names are held). It ends with ctx, and
// after a few seconds at most.
func (e *Engine) Holders(ctx context.Context, in string) ([]string, error) {
	return e.looks.holders(ctx, in)
}

// A Peek is what an Engine shows of itself and of one key: what the root
// package's tests see of the machinery under the leases.
type Peek struct {
	Wakeups int  // channels held at once, at most; 0: they are off
	Refused bool // the channels turned off by themselves
	Keys    int  // keys callers wait for
	InUse   int  // channel connections taken
	Sending bool // a goroutine sends looks
	// Of the key: the callers waiting, the refused attempts counted for
	// its head (-1: nobody waits), whether it has a channel (held or in
	// use) and whether the Client holds it.
	Waiting, HeadAttempts int
	Has, Holds            bool
}

// Peek returns what e shows of itself and of key.
func (e *Engine) Peek(key string) Peek {
	ws := &e.channels
	return Peek{Wakeups: ws.max, Refused: ws.refused.Load(), Keys: int(e.queues.keys()),
		InUse: ws.inUse(), Sending: e.looks.sending(),
		Waiting: e.queues.waiting(key), HeadAttempts: e.queues.headAttempts(key),
		Has: ws.has(key), Holds: ws.holds(key)}
}
