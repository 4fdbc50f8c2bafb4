package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// Counting semaphores: a Semaphore's TryAcquire and Acquire take one of a
// name's n slots, each an ordinary lease row under a name derived from the
// semaphore's (queries.sql, slot_acquire). Read from Semaphore down.

const (
	// MaxSlots is the most slots a semaphore may have: taking a slot writes
	// every slot row up to it, so its cost grows with n.
	MaxSlots = 64
	// maxSemaphoreNameLen is the longest semaphore name, in bytes: a slot's
	// row is named by the semaphore's name and 7 bytes more, within the
	// MaxNameLen the name column holds.
	maxSemaphoreNameLen = MaxNameLen - len(slotMark) - 2
)

// slotMark follows a semaphore's name in the names of its rows in the
// table (engine.SlotMark); no lock name may end with it, or with it and
// two digits (checkName). A Lock's kind is its lockKind, never read from a
// name.
const slotMark = engine.SlotMark

// slotRows is the fence row's name of semaphore name: P in queries.sql.
func slotRows(name string) string { return engine.SlotRows(name) }

// slotRowsEnd is Q in queries.sql (engine.SlotRowsEnd).
func slotRowsEnd(name string) string { return engine.SlotRowsEnd(name) }

// slotName is the name of slot i (1-based) of semaphore name.
func slotName(name string, i int) string { return engine.SlotName(name, i) }

// isSemaphoreRow reports whether a name ends with slotMark, alone or
// followed by two digits: such rows are a semaphore's, and no lock may
// have the name.
func isSemaphoreRow(name string) bool {
	if strings.HasSuffix(name, slotMark) {
		return true
	}
	n := len(name)
	return n >= len(slotMark)+2 && isDigit(name[n-1]) && isDigit(name[n-2]) &&
		name[n-2-len(slotMark):n-2] == slotMark
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// slotOfRow returns the semaphore and the slot of a row read from the
// table (Client.List, Semaphore.Inspect) that is a slot's, or s and 0 for
// a lock's.
func slotOfRow(s string) (name string, slot int) {
	n := len(s)
	if n < len(slotMark)+2 || !isDigit(s[n-1]) || !isDigit(s[n-2]) || s[n-2-len(slotMark):n-2] != slotMark {
		return s, 0
	}
	return s[:n-2-len(slotMark)], int(s[n-2]-'0')*10 + int(s[n-1]-'0')
}

// deleteByToken deletes any slot token holds in semaphore sem and returns
// how many rows went.
func (*semOrphans) deleteByToken(ctx context.Context, c *Client, sem, token string) (int64, error) {
	var res sql.Result
	err := fault.Transient(ctx, func() (err error) {
		res, err = c.db.ExecContext(ctx, c.eng.Text().Substitute(queries["slot_release"]), slotRows(sem), slotRowsEnd(sem), token)
		return err
	})
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// checkSlotArgs returns an error naming what is wrong with a semaphore's
// arguments.
func checkSlotArgs(name string, n int, ttl time.Duration) error {
	switch {
	case name == "":
		return errors.New("sqllock: empty semaphore name")
	case len(name) > maxSemaphoreNameLen:
		return fmt.Errorf("sqllock: semaphore name is %d bytes, longer than the %d its slots' names leave (maxSemaphoreNameLen)", len(name), maxSemaphoreNameLen)
	case isSemaphoreRow(name):
		return fmt.Errorf("sqllock: semaphore name %q ends with the bytes that mark a semaphore's rows (0x00 'slot')", name)
	case n < 1:
		return fmt.Errorf("sqllock: a semaphore needs at least 1 slot, not %d", n)
	case n > MaxSlots:
		return fmt.Errorf("sqllock: %d slots is more than the %d a semaphore may have (MaxSlots)", n, MaxSlots)
	}
	return checkTTL(ttl)
}

// A Semaphore is a counting semaphore of n slots on a name, made by
// [Client.Semaphore]: at most n holders hold one of its slots at once, each
// with a Lock like any other ([Lock.Slot] says which slot). An acquire with
// another n than the server records resizes the semaphore while no slot is
// held, and otherwise fails with an error wrapping [ErrSlotCount]. On TiDB
// and through Vitess an acquire fails with [ErrUnsupportedServer]
// (docs/usage.md#counting-semaphores).
type Semaphore struct {
	c    *Client
	name string
	n    int
}

// Semaphore returns the semaphore of n slots on name. Its methods refuse a
// bad name, or n outside 1 to [MaxSlots], before anything is sent.
func (c *Client) Semaphore(name string, n int) *Semaphore {
	return &Semaphore{c: c, name: name, n: n}
}

// TryAcquire makes one attempt to take a free slot for ttl, as
// [Client.TryAcquire] does for a name, and returns an error wrapping
// [ErrNotAcquired] when all n are held.
func (s *Semaphore) TryAcquire(ctx context.Context, ttl time.Duration) (*Lock, error) {
	call, err := s.c.newSlotCall(s.name, s.n, ttl)
	if err != nil {
		return nil, err
	}
	start := s.c.obsNow(s.c.obs.AcquireDone != nil)
	l, err := call.attempt(ctx)
	call.done(ctx, start, l, err)
	return l, err
}

// Acquire takes a slot like [Semaphore.TryAcquire], waiting while all n are
// held, as [Client.Acquire] waits for a name: until it succeeds, the
// Client's [RetryStrategy] gives up, or ctx ends.
func (s *Semaphore) Acquire(ctx context.Context, ttl time.Duration) (*Lock, error) {
	c := s.c
	call, err := c.newSlotCall(s.name, s.n, ttl)
	if err != nil {
		return nil, err
	}
	start := c.obsNow(c.obs.AcquireDone != nil)
	var l *Lock
	if _, ok := c.retry.Backoff(1); !ok {
		l, err = call.attempt(ctx)
	} else {
		if j := c.wait.Lane(call.n, call.laneKey); j > 0 {
			call.lanes, call.lane = true, j
		}
		l, err = call.waitFor(ctx, call)
	}
	call.done(ctx, start, l, err)
	return l, err
}

// done reports the call, begun at start, that returned l and err to the
// Observer's AcquireDone, as every kind's acquire call is, under the
// semaphore's name.
func (s *slotCall) done(ctx context.Context, start time.Time, l *Lock, err error) {
	if s.c.obs.AcquireDone == nil {
		return
	}
	a := s.acquireCall
	a.name = s.sem
	s.c.acquireDone(ctx, &a, start, l, err)
}

// A slotCall is one call that takes a slot of a semaphore. It owns the
// call's owner token, and follows an acquireCall's rules for statements
// whose outcome stays unknown (acquire.go), with the orphan list keyed by
// the semaphore (semOrphans). It is used by one goroutine.
type slotCall struct {
	acquireCall // name is the fence row's (P); the Lock's is the slot's
	sem         string
	n           int
	// The attempt under way: how many slot rows the next statement
	// visits, and the statements sent.
	v      int
	rounds int
	// lanes: a waiting Acquire waits in lane (1-based) of the semaphore's
	// lanes (internal/wait's Engine.Lane; laneKey); else in one queue, the
	// key shared.
	lanes bool
	lane  int
}

func (c *Client) newSlotCall(name string, n int, ttl time.Duration) (*slotCall, error) {
	if err := checkSlotArgs(name, n, ttl); err != nil {
		return nil, err
	}
	token, err := c.renewals.token(ttl) // a slot is attached as a name is (session.go)
	if err != nil {
		return nil, fmt.Errorf("sqllock: token: %w", err)
	}
	return &slotCall{acquireCall: acquireCall{c: c, name: slotRows(name), ttl: ttl, token: token}, sem: name, n: n}, nil
}

// Insert ids of slot_acquire below 2^32 (queries.sql); a slot taken gives
// the fence times 128 plus the slot.
const (
	slotResized  = engine.SlotResized
	slotMismatch = engine.SlotMismatch
	slotWiden    = engine.SlotWiden
	slotTaken    = engine.SlotTaken
)

// maxSlotRounds bounds the statements one attempt sends while the slot
// count changes under it.
const maxSlotRounds = 4

// attempt sends slot_acquire, again with the wider visit or after a
// resize its answer asks for, and cleans up after it when its outcome
// stays unknown (acquireCall.run, acquire.go).
func (s *slotCall) attempt(ctx context.Context) (*Lock, error) { return s.run(ctx, s) }

// What internal/wait's Engine.Acquire needs of a slot's waiting acquire
// (wait.Call), beside what the acquireCall gives: the key of its lane, or
// the semaphore's own; no look, which is single names' alone; and a key
// shared by every slot when the semaphore has no lanes.

func (s *slotCall) Key() string          { return s.laneKey(s.lane) }
func (s *slotCall) Label() string        { return s.sem }
func (s *slotCall) Op() string           { return fmt.Sprintf("acquire a slot of %q", s.sem) }
func (s *slotCall) Final(err error) bool { return errors.Is(err, ErrSlotCount) }
func (s *slotCall) Look() string         { return "" }
func (s *slotCall) Shared() bool         { return s.n > 1 && !s.lanes }
func (s *slotCall) Attempt(ctx context.Context) (func() (time.Time, bool), error) {
	return s.took(s.attempt(ctx))
}

// TTL bounds a wait on the key's channel: a lane's waits a second at
// most, then polls once, since a slot freed on a lane nobody waits on
// wakes no process.
func (s *slotCall) TTL() time.Duration {
	if s.lanes {
		return min(s.ttl, time.Second)
	}
	return s.ttl
}

// laneKey is the key of lane j (1-based) of the call's semaphore.
func (s *slotCall) laneKey(j int) string { return laneKey(s.sem, s.name, j) }

// laneKey is the key of lane j (1-based) of the semaphore sem whose fence
// row is named p. Lanes (internal/wait's lanes.go) make a semaphore of n >
// 1 slots fair between processes: a waiting Acquire joins one of up to n,
// each a queue and a wake-up channel of its own. Lane 1 is the semaphore's
// own key, p, so that an Acquire that does not wait sends and makes
// nothing more than before; lane j > 1 is the name of slot j's row, which
// no lock name and no other key may be.
func laneKey(sem, p string, j int) string {
	if j <= 1 {
		return p
	}
	return slotName(sem, j)
}

// A slot's part of an attempt (leaseKind): slot_acquire, visiting v slot
// rows, whose insert id names the slot taken with its fence, or asks for
// another visit.

func (s *slotCall) ready(ctx context.Context) error {
	if err := s.c.slotsServer(ctx); err != nil {
		return s.c.serverError(s.Op(), err)
	}
	s.v, s.rounds = s.n, 0
	return nil
}

// A slot's token is remembered under its semaphore, in the semaphores'
// orphan list: a send may have taken any slot.

func (s *slotCall) claim(ctx context.Context) { s.c.claimOrphans(ctx, &s.c.semOrphans, s.sem) }

func (s *slotCall) cleanup(ctx context.Context, last time.Time, sends int) {
	s.cleanupIn(ctx, &s.c.semOrphans, s.sem, last, sends)
}

func (s *slotCall) retire(last time.Time, once bool) { s.retireIn(&s.c.semOrphans, s.sem, last, once) }

func (s *slotCall) send(ctx context.Context) (sql.Result, int, error) {
	s.rounds++
	c := s.c
	return c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Prepared: true, Label: "slot_acquire", Name: s.sem, Text: c.eng.SlotAcquire(s.v), Args: s.args(s.v)})
}

func (s *slotCall) heldBy(_ context.Context, err error) error {
	if n, ok := fault.Errno(err); ok && n == fault.LockWaitTimeout {
		return fmt.Errorf("%w: a slot of %q stayed locked by another transaction (a holder's Lock.Check?)", ErrNotAcquired, s.sem)
	}
	return nil
}

func (s *slotCall) read(ctx context.Context, res sql.Result, sent, last time.Time, unknown int) (*Lock, bool, error) {
	id64, err := res.LastInsertId()
	if err != nil {
		if unknown > 0 {
			s.retire(last, unknown == 1)
		}
		return nil, false, errorf("%s: %w", s.Op(), err)
	}
	id := uint64(id64)
	if id < slotTaken && unknown > 0 {
		// An earlier send of this round may commit later (rule 2).
		s.retire(last, unknown == 1)
	}
	switch {
	case id >= slotTaken:
		l, err := s.taken(ctx, id, sent, last, unknown)
		return l, false, err
	case id == 0:
		return nil, false, fmt.Errorf("%w: all %d slots of %q are held", ErrNotAcquired, s.n, s.sem)
	case id == slotResized:
		s.v = s.n
	case id > slotWiden && id <= slotWiden+MaxSlots:
		s.v = int(id - slotWiden)
	case id > slotMismatch && id <= slotMismatch+MaxSlots:
		r := int(id - slotMismatch)
		if r != s.n {
			return nil, false, errorf("%w: %w: %q has %d slots, not %d, and one is held", ErrNotAcquired, ErrSlotCount, s.sem, r, s.n)
		}
		s.v = s.n // resized to n under this call's wider visit
	default:
		return nil, false, errorf("%s: unexpected answer %d; was the table changed by hand?", s.Op(), id)
	}
	if s.rounds >= maxSlotRounds {
		return nil, false, errorf("%w: %w: the slot count of %q kept changing (callers ask for different counts)", ErrNotAcquired, ErrSlotCount, s.sem)
	}
	return nil, true, nil
}

// taken returns the Lock on the slot the answer id names, taken by a
// statement first sent at sent and last before last, unknown of whose sends
// had an unknown outcome.
func (s *slotCall) taken(ctx context.Context, id uint64, sent, last time.Time, unknown int) (*Lock, error) {
	slot, fence := int(id%128), id/128
	if slot < 1 || slot > s.n {
		s.cleanup(ctx, last, unknown+1)
		return nil, errorf("%s: unexpected answer %d (slot %d); was the table changed by hand?", s.Op(), id, slot)
	}
	if unknown > 0 {
		s.releaseOthers(ctx, slot)
	}
	l := newLock(s.c, slotName(s.sem, slot), s.token, fence, s.ttl, sent.Add(s.ttl))
	l.kind = &slotKind{sem: s.sem, num: uint8(slot), lane: uint8(s.lane)}
	return l, nil
}

// releaseOthers deletes the slots other than slot that the call's token
// holds: a send of the statement whose reply was lost may have taken one,
// which a later send leaves ours (queries.sql, slot_acquire). It is given
// back at once rather than at the Lock's release (rule 3 of acquireCall),
// with a context of its own; on failure it expires by itself. A send that
// runs later still may take one again: that one goes at the release.
func (s *slotCall) releaseOthers(ctx context.Context, slot int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	c, mine := s.c, slotName(s.sem, slot)
	for _, r := range [][2]string{{s.name, mine}, {mine, slotRowsEnd(s.sem)}} {
		err := fault.Transient(ctx, func() error {
			_, err := c.db.ExecContext(ctx, c.eng.Text().Substitute(queries["slot_release"]), r[0], r[1], s.token)
			return err
		})
		if err != nil {
			return
		}
	}
}

// args returns slot_acquire's arguments for a visit of v slot rows.
func (s *slotCall) args(v int) []any {
	return engine.SlotArgs(s.sem, s.n, v, s.token, s.c.holderArg, s.ttl.Microseconds())
}

// slotsServer makes the Client's first-use check and the proof of its
// statements, if not made yet, refuses servers whose LAST_INSERT_ID()
// does not carry a value from row to row, and proves the semaphore
// statements at the first use (internal/engine/slots.go).
func (c *Client) slotsServer(ctx context.Context) error {
	if _, err := c.slotsForms(ctx, qRelease); err != nil {
		return err
	}
	return c.eng.ProveSlots(ctx)
}

// slotsForms prepares statement i, which makes the first-use check (and,
// for a statement that writes, the proof of the statements), and refuses
// servers without semaphores. Semaphore.Inspect prepares inspect, a read,
// which needs no proof, as Client.Inspect needs none.
func (c *Client) slotsForms(ctx context.Context, i int) (*engine.Forms, error) {
	if _, err := c.eng.Stmt(ctx, i); err != nil {
		return nil, err
	}
	f := c.eng.Forms()
	if r := f.SlotsRefusal(); r != "" {
		return nil, errorf("%w: %s", ErrUnsupportedServer, r)
	}
	return f, nil
}

// Slot returns the number of the semaphore slot the lease is on, 1 to n,
// for a Lock taken by a [Semaphore]; 0 otherwise.
func (l *Lock) Slot() int { return l.kind.slot() }

// A slotKind is the lockKind (lock.go) of a Lock on slot num of the semaphore
// sem: the Lock's name is the slot's row, refreshed, released and checked
// as a name's lease is. lane is the lane its Acquire waited in
// (laneKey), whose channel its release lets go of; 0 for the semaphore's
// own key.
type slotKind struct {
	nameKind
	sem       string
	num, lane uint8
}

func (h *slotKind) name(*Lock) string    { return h.sem }
func (h *slotKind) slot() int            { return int(h.num) }
func (h *slotKind) names(*Lock) []string { return []string{h.sem} }
func (h *slotKind) waitKey(*Lock) string { return laneKey(h.sem, slotRows(h.sem), int(h.lane)) }
func (h *slotKind) orphans(l *Lock) (orphanList, []string) {
	return &l.c.semOrphans, []string{h.sem}
}

// kick makes this Client's callers waiting in the slot's lane try now; and
// every lane's, when its Acquire did not wait: it held no lane's channel,
// so its release woke no other process.
func (h *slotKind) kick(l *Lock) {
	l.c.wait.Kick(h.waitKey(l))
	if !l.hold.Load().Contended() {
		p := slotRows(h.sem)
		l.c.wait.Kick(p)
		l.c.wait.KickLanes(func(j int) string { return laneKey(h.sem, p, j) })
	}
}
