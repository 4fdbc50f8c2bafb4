package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// The statements of a Lock on a set of names (acquire_set.go): each acts on
// every lease of the set in one statement, sent as text, and succeeds only
// when it finds every lease ours.

// A lockSet is what a Lock on several names keeps of them: the names,
// sorted, their fences, and the literals the set's statements are made of
// (engine.Set), and the set's label.
type lockSet struct {
	*engine.Set
	label string
}

func newLockSet(names []string, token string) *lockSet {
	return &lockSet{Set: engine.NewSet(names, token), label: setLabel(names)}
}

// Names returns the names the lease is on, sorted: a set's, or [Lock.Name].
func (l *Lock) Names() []string { return l.kind.names(l) }

// Fences returns the fence of each name of [Lock.Names], in order: each is
// [Lock.Fence] on MySQL and MariaDB; on TiDB and Vitess each name has its
// own, the greatest being Fence.
func (l *Lock) Fences() []uint64 { return l.kind.fences(l) }

// label names the Lock's name or set in errors.
func (l *Lock) label() string { return l.kind.label(l) }

// setKey is the key of the queue and wake-up channel of the set of sorted
// names: its label after setKeyMark. A set's key is longer than MaxNameLen,
// and no name is (a lock's, a semaphore's rows' and lanes'): so a set
// shares its queue and channel with no lock and no semaphore, and no name
// stands for a set.
func setKey(names []string) string { return setKeyMark + setLabel(names) }

// setKeyMark begins a set's key: MaxNameLen+1 zero bytes.
var setKeyMark = strings.Repeat("\x00", MaxNameLen+1)

// A setKind is the lockKind (lock.go) of a Lock on a set; the Lock's name is
// the set's first.
type setKind struct{ set *lockSet }

func (h setKind) name(l *Lock) string                    { return l.name }
func (setKind) slot() int                                { return 0 }
func (h setKind) names(*Lock) []string                   { return slices.Clone(h.set.Names) }
func (h setKind) fences(*Lock) []uint64                  { return slices.Clone(h.set.Fences) }
func (h setKind) label(*Lock) string                     { return h.set.label }
func (h setKind) rows(*Lock) []string                    { return h.set.Names }
func (h setKind) waitKey(*Lock) string                   { return setKey(h.set.Names) }
func (h setKind) orphans(l *Lock) (orphanList, []string) { return &l.c.orphans, h.set.Names }

// kick makes this Client's callers waiting for the set, or for any of its
// names, try now.
func (h setKind) kick(l *Lock) {
	l.c.wait.Kick(h.waitKey(l))
	for _, n := range h.set.Names {
		l.c.wait.Kick(n)
	}
}

// refresh sends the refresh of a set; ok reports whether every lease of
// the set was extended. It is all or nothing: a lease of the set another
// owner holds, that expired or that is gone fails the statement with 1690
// (queries.sql, all_refresh), which undoes it.
func (h setKind) refresh(ctx context.Context, l *Lock, until time.Time, ttl time.Duration) (ok bool, err error) {
	l.detach() // the refresh detaches the set's leases from their session
	s := h.set
	q := l.c.eng.SetRefresh(s.Set, ttl)
	res, _, err := l.c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "all_refresh", Name: s.label, Text: q, Until: until})
	if n, isServer := fault.Errno(err); isServer && n == fault.OutOfRange && engine.SessionGuard(err) == "" {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return h.allRows(res)
}

// release sends the release of a set: the leases are deleted, or with
// minHold > 0 kept until acquired_at + minHold (do.go). ours reports
// whether every lease of the set was still ours.
func (h setKind) release(ctx context.Context, l *Lock, minHold time.Duration) (ours, maybeApplied bool, err error) {
	s := h.set
	q, stmt := l.c.eng.SetRelease(s.Set, minHold)
	res, unknown, err := l.c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: stmt, Name: s.label, Text: q})
	if maybeApplied = unknown > 0; err != nil {
		return false, maybeApplied, err
	}
	ours, err = h.allRows(res)
	return ours, maybeApplied, err
}

// check is Check for a set.
func (h setKind) check(ctx context.Context, l *Lock, tx *sql.Tx) error {
	s := h.set
	res, err := tx.ExecContext(ctx, l.c.eng.SetCheck(s.Set))
	if err != nil {
		return l.c.serverError("check "+s.label, err)
	}
	ok, err := h.allRows(res)
	if err != nil {
		return errorf("check %s: %w", s.label, err)
	}
	if !ok {
		return fmt.Errorf("%w: a lease of %s expired or was taken over", ErrNotHeld, s.label)
	}
	return nil
}

// allRows reports whether res affected every row of the set. The set's
// statements change every row they match (queries.sql), so the count does
// not depend on clientFoundRows.
func (h setKind) allRows(res sql.Result) (bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == int64(len(h.set.Names)), nil
}

// kickAll makes callers of this Client waiting for any name of the Lock,
// or for its set or semaphore, try now.
func (l *Lock) kickAll() {
	if !l.c.wait.Waiting() {
		return
	}
	l.kind.kick(l)
}

// sentTwice records that the Lock's acquire was sent more than once, the
// last time at last at the latest (acquire.go, rule 3).
func (l *Lock) sentTwice(last time.Time) {
	l.lateSent = max(last.Sub(monoBase), 1)
}

// lateOrphan is the Lock's token as the orphan list keeps it once the Lock
// is released (rememberLate).
func (l *Lock) lateOrphan(kept time.Time) orphan {
	x := newOrphan(l.token, l.ttl, monoBase.Add(l.lateSent), false)
	x.Kept = kept
	return x
}

// rememberLate hands the Lock's token to the orphan list for each of its
// names, until a late send of its acquire can no longer commit (acquire.go,
// rule 3). kept, when set, is when a release with a minimum hold keeps the
// leases until at the latest: the list deletes nothing before.
func (l *Lock) rememberLate(kept time.Time) {
	list, keys := l.kind.orphans(l)
	for _, k := range keys {
		list.book().Remember(k, l.lateOrphan(kept))
	}
}
