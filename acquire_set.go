package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/settle"
)

// Sets: a Lock on several names, taken all or nothing by TryAcquireSet or
// AcquireSet in one statement (queries.sql, all_acquire), and refreshed,
// checked and released with one statement each. Each name of a set has an
// ordinary lease row under the set's one token, so the orphan list, List,
// Inspect and ForceRelease treat it as a lease of its own. Read from
// TryAcquireSet down; the Lock's set statements are in lock_set.go.

// MaxNames is the most names a set ([Client.TryAcquireSet]) may have.
const MaxNames = 64

// errSetsThroughVitess refuses sets through Vitess. A set's names may live
// on different shards: vtgate writes each shard's rows in a transaction of
// its own, so the row locks that order two overlapping sets on one server
// order nothing across shards, and two sets can wait for each other until
// innodb_lock_wait_timeout ends both (seen in the tests); and it commits the
// shards one after another, so a failure between two commits would leave
// half a set taken.
var errSetsThroughVitess = errorf("%w: several names at once are refused through Vitess: a set's names may live on different shards, which neither lock in one order nor commit at once (docs/servers.md)", ErrUnsupportedServer)

// checkNames returns the names of a set sorted, or an error naming what is
// wrong with them.
func checkNames(names []string) ([]string, error) {
	switch {
	case len(names) == 0:
		return nil, errors.New("sqllock: no lock names")
	case len(names) > MaxNames:
		return nil, fmt.Errorf("sqllock: %d lock names, more than the %d one call takes (MaxNames)", len(names), MaxNames)
	}
	for _, n := range names {
		if err := checkName(n); err != nil {
			return nil, err
		}
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, fmt.Errorf("sqllock: lock name %q given twice", sorted[i])
		}
	}
	return sorted, nil
}

// TryAcquireSet makes one attempt to take the leases on every name of names
// for ttl, all or none, in one statement. When any is held by another owner's
// live lease it takes none and returns a [*HeldError], which wraps
// [ErrNotAcquired]; bad input (no names, more than [MaxNames], a bad or
// repeated name) is refused before anything is sent. Each method of the Lock
// acts on the whole set in one statement that succeeds only while every lease
// is ours. Overlapping sets never deadlock or take half each.
func (c *Client) TryAcquireSet(ctx context.Context, names []string, ttl time.Duration) (*Lock, error) {
	a, err := c.newAcquireAllCall(names, ttl)
	if err != nil {
		return nil, err
	}
	start := c.obsNow(c.obs.AcquireDone != nil)
	l, err := (&setCall{acquireCall: a}).attempt(ctx)
	c.acquireDone(ctx, &a, start, l, err)
	return l, err
}

// AcquireSet takes every name of names like [Client.TryAcquireSet], waiting
// as [Client.Acquire] does, with the set in place of a name. A
// [Client.Acquire] of one of its names does not wait in the set's queue, so a
// set whose names are taken one by one, again and again, may wait long: give
// ctx a deadline.
func (c *Client) AcquireSet(ctx context.Context, names []string, ttl time.Duration) (*Lock, error) {
	a, err := c.newAcquireAllCall(names, ttl)
	if err != nil {
		return nil, err
	}
	start := c.obsNow(c.obs.AcquireDone != nil)
	call := &setCall{acquireCall: a}
	var l *Lock
	if _, ok := c.retry.Backoff(1); !ok {
		l, err = call.attempt(ctx)
	} else {
		l, err = call.waitFor(ctx, call)
	}
	c.acquireDone(ctx, &call.acquireCall, start, l, err)
	return l, err
}

// newAcquireAllCall checks the arguments of a set's acquire, before
// anything is sent, and draws the owner token for it. The call's name is
// the set's label, for logs and the Observer.
func (c *Client) newAcquireAllCall(names []string, ttl time.Duration) (acquireCall, error) {
	sorted, err := checkNames(names)
	if err != nil {
		return acquireCall{}, err
	}
	a, err := c.newAcquireCall(sorted[0], ttl)
	if err != nil {
		return acquireCall{}, err
	}
	a.names, a.name = sorted, setLabel(sorted)
	return a, nil
}

// setLabel names a set in errors, logs and the Observer's events.
func setLabel(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// A setCall is an acquireCall for a set: name is the set's label, names
// its names; set is the lease set of the attempt under way.
type setCall struct {
	acquireCall
	set *lockSet
}

// What internal/wait's Engine.Acquire needs of a set's waiting acquire
// (wait.Call), beside what the acquireCall gives: the set's own key
// (setKey), and no look, which is single names' alone.

func (a *setCall) Key() string                                { return setKey(a.names) }
func (a *setCall) Op() string                                 { return "acquire " + a.name }
func (a *setCall) Look() string                               { return "" }
func (a *setCall) attempt(ctx context.Context) (*Lock, error) { return a.run(ctx, a) }
func (a *setCall) Attempt(ctx context.Context) (func() (time.Time, bool), error) {
	return a.took(a.attempt(ctx))
}

// A set's part of an attempt (leaseKind): all_acquire, sent as text,
// whose insert id carries the set's fence; a refusal says which names are
// held.

func (a *setCall) ready(ctx context.Context) error {
	c := a.c
	// The first use's check and proof, and the choice of forms, come with
	// the acquire's prepare; the set's statement is sent as text.
	if _, err := c.eng.Stmt(ctx, qAcquire); err != nil {
		return c.serverError(a.Op(), err)
	}
	if c.eng.Forms().RefusesSets() {
		return errSetsThroughVitess
	}
	if err := c.eng.ProveSets(ctx); err != nil {
		return c.serverError(a.Op(), err)
	}
	return nil
}

func (a *setCall) claim(ctx context.Context) {
	for _, n := range a.names {
		a.c.claimOrphans(ctx, &a.c.orphans, n)
	}
}

func (a *setCall) send(ctx context.Context) (sql.Result, int, error) {
	a.set = newLockSet(a.names, a.token)
	return a.c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "all_acquire", Name: a.name, Text: a.c.eng.SetAcquire(a.set.Set, a.ttl)})
}

func (a *setCall) heldBy(ctx context.Context, err error) error {
	if n, ok := fault.Errno(err); ok && (n == fault.OutOfRange && engine.SessionGuard(err) == "" || n == fault.LockWaitTimeout) {
		return a.c.heldOf(ctx, a.set)
	}
	return nil
}

func (a *setCall) read(ctx context.Context, res sql.Result, sent, last time.Time, unknown int) (*Lock, bool, error) {
	s := a.set
	if err := a.c.eng.ReadFences(ctx, s.Set, res); err != nil {
		a.cleanup(ctx, last, unknown+1)
		return nil, false, fmt.Errorf("sqllock: %s: %w", a.Op(), err)
	}
	l := newLock(a.c, a.names[0], a.token, slices.Max(s.Fences), a.ttl, sent.Add(a.ttl))
	l.kind = setKind{s}
	return l, false, nil
}

// heldOf returns the error of a refused acquire of set s: which names a
// live lease of another owner holds now (internal/wait's look, which ends
// with ctx and after a few seconds at most): one that ctx cuts short
// returns the refusal without its holders, so a refused call returns
// within its context.
func (c *Client) heldOf(ctx context.Context, s *lockSet) error {
	names, err := c.wait.Holders(ctx, s.In)
	if err != nil {
		return heldUnread(&HeldError{}, err)
	}
	slices.Sort(names)
	return &HeldError{Names: names}
}

// heldUnread returns refusal e when the look for its holders failed with
// err, the caller's context ending included.
func heldUnread(e *HeldError, err error) error {
	return fmt.Errorf("%w (reading which names were held: %w)", e, err)
}

// cleanup deletes every lease the set's attempt may have taken, as
// acquireCall.cleanup does for one name (sends and last as there), in one statement.
// The acquire wrote all of the set's rows or none: a DELETE that removed
// any removed all that one send wrote, which settles it when only one send
// could commit; one sent after the acquire could still commit proves none
// is left. Otherwise each name's lease goes to the orphan list (rule 2 of
// acquireCall).
func (a *setCall) cleanup(ctx context.Context, last time.Time, sends int) {
	s := a.set
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	x := newOrphan(a.token, a.ttl, last, sends == 1)
	if settle.Delete(ctx, x, func(ctx context.Context, _ string) (int64, error) {
		q, stmt := a.c.eng.SetRelease(s.Set, 0)
		res, _, err := a.c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: stmt, Name: a.name, Text: q})
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}) {
		for _, name := range s.Names {
			a.c.unknown(name, true)
		}
		a.renew()
		return
	}
	a.c.log.Warn("sqllock: an acquire's outcome stays unknown; its leases, if any, are deleted before this Client's next acquire of their names", "names", a.name)
	for _, name := range s.Names {
		a.c.orphans.Remember(name, newOrphan(a.token, a.ttl, last, sends == 1))
		a.c.unknown(name, false)
	}
	if a.c.isClosed() {
		for _, name := range s.Names {
			a.c.releaseOrphansOf(&a.c.orphans, name)
		}
	}
	a.renew()
}
