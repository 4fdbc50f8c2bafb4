package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Counting semaphores: TryAcquireSlot and AcquireSlot take one of a name's
// n slots, each an ordinary lease row under a name derived from the
// semaphore's (queries.sql, slot_acquire), so the Lock they return renews,
// releases and checks as any Lock does. Read from TryAcquireSlot down.

const (
	// MaxSlots is the most slots a semaphore may have. The statement that
	// takes a slot writes every slot row up to the one it takes, and the
	// fence row twice, under row locks, so its cost grows with n; a slot's
	// number is also kept in two digits of its row's name and in the low
	// bits of the statement's answer (queries.sql).
	MaxSlots = 64
	// MaxSemaphoreNameLen is the longest semaphore name, in bytes: a slot's
	// row is named by the semaphore's name and 7 bytes more, within the
	// MaxNameLen the name column holds.
	MaxSemaphoreNameLen = MaxNameLen - len(slotMark) - 2
)

// ErrSlotCount means a semaphore was asked for with another number of slots
// than the one it has while one of its slots is held. The error that wraps
// it names both numbers; it wraps [ErrNotAcquired] too.
var ErrSlotCount = errors.New("sqllock: the semaphore has another number of slots")

// slotMark follows a semaphore's name in the names of its rows; no lock
// name may end with it, or with it and two digits (checkName).
const slotMark = "\x00slot"

// slotRows is the fence row's name of semaphore name: P in queries.sql.
func slotRows(name string) string { return name + slotMark }

// slotRowsEnd is Q in queries.sql: every name that starts with P sorts
// below it, byte for byte.
func slotRowsEnd(name string) string {
	return name + slotMark[:len(slotMark)-1] + string(slotMark[len(slotMark)-1]+1)
}

// slotName is the name of slot i (1-based) of semaphore name.
func slotName(name string, i int) string {
	return slotRows(name) + string([]byte{'0' + byte(i/10), '0' + byte(i%10)})
}

// isSlotMarked reports whether a lock name ends with slotMark, alone or
// followed by two digits: such names are a semaphore's.
func isSlotMarked(name string) bool {
	if strings.HasSuffix(name, slotMark) {
		return true
	}
	n := len(name)
	return n >= len(slotMark)+2 && isDigit(name[n-1]) && isDigit(name[n-2]) &&
		name[n-2-len(slotMark):n-2] == slotMark
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// splitSlotName returns the semaphore and the slot of a slot's row name, or
// s and 0 for a lock's name.
func splitSlotName(s string) (name string, slot int) {
	n := len(s)
	if n < len(slotMark)+2 || !isDigit(s[n-1]) || !isDigit(s[n-2]) || s[n-2-len(slotMark):n-2] != slotMark {
		return s, 0
	}
	return s[:n-2-len(slotMark)], int(s[n-2]-'0')*10 + int(s[n-1]-'0')
}

// orphanKey is the name under which the orphan list remembers the token
// of an acquire of lease name: for a slot, its semaphore's fence row name,
// whose tokens are deleted from every slot (deleteSlotOrphan).
func orphanKey(name string) string {
	if sem, slot := splitSlotName(name); slot > 0 {
		return slotRows(sem)
	}
	return name
}

// checkSlotArgs returns an error naming what is wrong with a semaphore's
// arguments.
func checkSlotArgs(name string, n int, ttl time.Duration) error {
	switch {
	case name == "":
		return errors.New("sqllock: empty semaphore name")
	case len(name) > MaxSemaphoreNameLen:
		return fmt.Errorf("sqllock: semaphore name is %d bytes, longer than the %d its slots' names leave (MaxSemaphoreNameLen)", len(name), MaxSemaphoreNameLen)
	case isSlotMarked(name):
		return fmt.Errorf("sqllock: semaphore name %q ends with the bytes that mark a semaphore's rows (0x00 'slot')", name)
	case n < 1:
		return fmt.Errorf("sqllock: a semaphore needs at least 1 slot, not %d", n)
	case n > MaxSlots:
		return fmt.Errorf("sqllock: %d slots is more than the %d a semaphore may have (MaxSlots)", n, MaxSlots)
	}
	return checkTTL(ttl)
}

// TryAcquireSlot makes one attempt to take one of the n slots of the
// counting semaphore name for ttl, measured by the server's clock: at most n
// holders hold a slot of name at once. It takes the first slot that is free
// (never taken, released, or expired, whoever held it) and returns an error
// wrapping [ErrNotAcquired] when all n are held. A holder that dies frees its
// slot when its lease lapses. Fences grow across all the slots of a name,
// in the order acquisitions commit. The attempt is one statement (two or
// three when the number of slots changes, see below), sent again with the
// same token when the server rolls it back, as [Client.TryAcquire]'s is;
// each call draws a fresh owner token.
//
// The returned Lock is a lease on one slot: [Lock.Refresh], [Lock.Release],
// [Lock.KeepAlive] and [Lock.Check] work as on any Lock. [Lock.Name] returns
// name and [Lock.Slot] the slot's number, 1 to n.
//
// A semaphore records its n. A call with another n is taken as a resize
// when no slot is held, and otherwise refused with an error wrapping
// [ErrSlotCount] (and ErrNotAcquired) that names both numbers. Semaphore
// names share no rows with lock names: a lock and a semaphore may have the
// same name. Bad arguments (an empty name, one longer than
// [MaxSemaphoreNameLen], n outside 1 to [MaxSlots], a ttl outside
// [MinTTL] to [MaxTTL]) are refused before anything is sent.
//
// When the outcome stays unknown, the slot the attempt may have taken is
// deleted as an acquire's lease is (see [Client.TryAcquire]): at once, or
// before this Client's next acquire of a slot of name, or at Close.
//
// Semaphores need a server on which LAST_INSERT_ID() carries a value from
// one row of a statement to the next: MySQL and MariaDB. On TiDB, and
// through Vitess, the call fails, after the Client's first-use check and
// before any slot is written, with an error naming the server.
func (c *Client) TryAcquireSlot(ctx context.Context, name string, n int, ttl time.Duration) (*Lock, error) {
	s, err := c.newSlotCall(name, n, ttl)
	if err != nil {
		return nil, err
	}
	return s.attempt(ctx)
}

// AcquireSlot takes one of the n slots of name like [Client.TryAcquireSlot],
// waiting between attempts while all n are held, as the Client's
// [RetryStrategy] says, until it succeeds, the strategy gives up, or ctx
// ends. It polls: slots have no wake-up channel, and calls waiting for one
// semaphore do not queue. When ctx ends first, the error satisfies both
// errors.Is(err, ErrNotAcquired) and errors.Is(err, ctx.Err()). Errors other
// than all slots held (a refused n, a missing table, a lost server) end the
// call at once.
func (c *Client) AcquireSlot(ctx context.Context, name string, n int, ttl time.Duration) (*Lock, error) {
	s, err := c.newSlotCall(name, n, ttl)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		l, err := s.attempt(ctx)
		if err == nil || !errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrSlotCount) {
			return l, err
		}
		if cerr := ctxErr(ctx); cerr != nil {
			// ctx ended while the attempt ran, which found every slot held.
			if !errors.Is(err, cerr) {
				err = fmt.Errorf("%w (%w)", err, cerr)
			}
			return nil, err
		}
		wait, ok := c.retry.Backoff(attempt)
		if !ok {
			return nil, err
		}
		if werr := sleepCtx(ctx, wait); werr != nil {
			return nil, errorf("acquire a slot of %q: %w: %w", name, ErrNotAcquired, werr)
		}
	}
}

// A slotCall is one call that takes a slot of a semaphore. It owns the
// call's owner token, and follows an acquireCall's rules for statements
// whose outcome stays unknown (acquire.go), with the orphan list keyed by
// the semaphore (orphanKey). It is used by one goroutine.
type slotCall struct {
	acquireCall // name is the fence row's (P); the Lock's is the slot's
	sem         string
	n           int
}

func (c *Client) newSlotCall(name string, n int, ttl time.Duration) (*slotCall, error) {
	if err := checkSlotArgs(name, n, ttl); err != nil {
		return nil, err
	}
	token, err := newToken()
	if err != nil {
		return nil, fmt.Errorf("sqllock: token: %w", err)
	}
	return &slotCall{acquireCall: acquireCall{c: c, name: slotRows(name), ttl: ttl, token: token}, sem: name, n: n}, nil
}

// Insert ids of slot_acquire below 2^32 (queries.sql); a slot taken gives
// the fence times 128 plus the slot.
const (
	slotResized  = 1
	slotMismatch = 1000
	slotWiden    = 2000
	slotTaken    = 1 << 32
)

// maxSlotRounds bounds the statements one attempt sends while the slot
// count changes under it.
const maxSlotRounds = 4

// attempt sends slot_acquire, again with the wider visit or after a
// resize its answer asks for, and cleans up after it when its outcome
// stays unknown.
func (s *slotCall) attempt(ctx context.Context) (*Lock, error) {
	c := s.c
	if c.isClosed() {
		return nil, ErrClosed
	}
	if s.tokenErr != nil {
		return nil, s.tokenErr
	}
	op := fmt.Sprintf("acquire a slot of %q", s.sem)
	mariadb, err := c.slotsServer(ctx)
	if err != nil {
		return nil, c.serverError(op, err)
	}
	c.claimOrphans(ctx, s.name)
	v := s.n
	for round := 0; round < maxSlotRounds; round++ {
		sent := time.Now()
		s.attempts++
		res, maybeApplied, err := c.execSlot(ctx, slotSQL(c.table, mariadb, v), s.args(v))
		if err != nil {
			if maybeApplied {
				s.cleanup(ctx, sent)
			}
			if errors.Is(err, errRowBusy) {
				return nil, fmt.Errorf("%w: a slot of %q stayed locked by another transaction (a holder's Lock.Check?)", ErrNotAcquired, s.sem)
			}
			if cerr := ctxErr(ctx); cerr != nil {
				return nil, errorf("%s: %w: %w (last error: %w)", op, ErrNotAcquired, cerr, err)
			}
			return nil, c.serverError(op, err)
		}
		id64, err := res.LastInsertId()
		if err != nil {
			if maybeApplied {
				s.retire(sent)
			}
			return nil, errorf("%s: %w", op, err)
		}
		id := uint64(id64)
		if id < slotTaken && maybeApplied {
			// An earlier send of this round may commit later (rule 2).
			s.retire(sent)
		}
		switch {
		case id >= slotTaken:
			return s.taken(ctx, id, sent, maybeApplied)
		case id == 0:
			return nil, fmt.Errorf("%w: all %d slots of %q are held", ErrNotAcquired, s.n, s.sem)
		case id == slotResized:
			v = s.n
		case id > slotWiden && id <= slotWiden+MaxSlots:
			v = int(id - slotWiden)
		case id > slotMismatch && id <= slotMismatch+MaxSlots:
			r := int(id - slotMismatch)
			if r != s.n {
				return nil, errorf("%w: %w: %q has %d slots, not %d, and one is held", ErrNotAcquired, ErrSlotCount, s.sem, r, s.n)
			}
			v = s.n // resized to n under this call's wider visit
		default:
			return nil, errorf("%s: unexpected answer %d; was the table changed by hand?", op, id)
		}
	}
	return nil, errorf("%w: %w: the slot count of %q kept changing (callers ask for different counts)", ErrNotAcquired, ErrSlotCount, s.sem)
}

// taken returns the Lock on the slot the answer id names.
func (s *slotCall) taken(ctx context.Context, id uint64, sent time.Time, maybeApplied bool) (*Lock, error) {
	c := s.c
	slot, fence := int(id%128), id/128
	if slot < 1 || slot > s.n {
		s.cleanup(ctx, sent)
		return nil, errorf("acquire a slot of %q: unexpected answer %d (slot %d); was the table changed by hand?", s.sem, id, slot)
	}
	l := newLock(c, slotName(s.sem, slot), s.token, fence, s.ttl, sent.Add(s.ttl))
	if maybeApplied {
		l.sentTwice(sent) // acquire.go, rule 3
	}
	l.holdStarted()
	if !c.held.add(l) {
		s.cleanup(ctx, sent)
		l.holdEnded(HoldClosed, ErrClosed)
		return nil, ErrClosed
	}
	return l, nil
}

// args returns slot_acquire's arguments for a visit of v slot rows.
func (s *slotCall) args(v int) []any {
	c := s.c
	mode := 128
	if v != s.n {
		mode = 256
	}
	p, n, token, us := any(s.name), any(strconv.Itoa(s.n)), any(s.token), any(s.ttl.Microseconds())
	args := make([]any, 0, 16+8*v)
	args = append(args, mode, p, n)
	for i := 1; i <= v; i++ {
		args = append(args, i, slotName(s.sem, i), i, token, i, c.holderArg, i, us)
	}
	args = append(args, p)
	return append(args, token, n, mode, v, token, c.holderArg, token, us, token, token, token, n)
}

// slotsServer makes the Client's first-use check and the proof of its
// statements, if not made yet, and refuses servers whose LAST_INSERT_ID()
// does not carry a value from row to row. It reports whether the server is
// MariaDB, whose per-statement lock wait bound the statement takes.
func (c *Client) slotsServer(ctx context.Context) (mariadb bool, err error) {
	if _, err := c.stmt(ctx, qRelease); err != nil {
		return false, err
	}
	switch {
	case c.tidb.Load():
		return false, errors.New("counting semaphores are not available on TiDB: its LAST_INSERT_ID() does not carry a value from one row of a statement to the next, which taking a slot in one statement needs")
	case c.oneRow.Load():
		return false, errors.New("counting semaphores are not available through this server (Vitess, or a proxy that rewrites LAST_INSERT_ID()): LAST_INSERT_ID() does not carry a value from one row of a statement to the next, which taking a slot in one statement needs")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.HasPrefix(c.sql[qAcquire], queries["lock_wait_mariadb"]), nil
}

// slotSQLs caches slot_acquire's text by table, server and visit.
var slotSQLs sync.Map // slotSQLKey -> string

type slotSQLKey struct {
	table   string
	mariadb bool
	v       int
}

// slotSQL returns slot_acquire for table with its slot row written v times.
func slotSQL(table string, mariadb bool, v int) string {
	k := slotSQLKey{table, mariadb, v}
	if s, ok := slotSQLs.Load(k); ok {
		return s.(string)
	}
	q := queries["slot_acquire"]
	start := strings.Index(q, "(LAST_INSERT_ID(IF(")
	end := start + strings.Index(q[start:], "MICROSECOND),\n") + len("MICROSECOND),\n")
	row := q[start:end]
	text := q[:start] + strings.Repeat(row, v) + q[end:]
	if mariadb {
		text = queries["lock_wait_mariadb"] + "\n" + text
	}
	text = strings.ReplaceAll(text, tablePlaceholder, table)
	slotSQLs.Store(k, text)
	return text
}

// slotStmts holds a Client's slot_acquire statements, prepared once per
// number of slot rows visited (at most MaxSlots of them), until Close.
type slotStmts struct {
	mu     sync.Mutex
	byText map[string]*sql.Stmt
	closed bool
}

// stmt returns the statement of text, preparing it on first use.
func (s *slotStmts) stmt(ctx context.Context, db *sql.DB, text string) (*sql.Stmt, error) {
	s.mu.Lock()
	st, closed := s.byText[text], s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if st != nil {
		return st, nil
	}
	err := retryTransient(ctx, func() (err error) {
		st, err = db.PrepareContext(ctx, text)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.byText[text]; prev != nil || s.closed {
		_ = st.Close() // another call prepared it first, or Close came
		if s.closed {
			return nil, ErrClosed
		}
		return prev, nil
	}
	if s.byText == nil {
		s.byText = make(map[string]*sql.Stmt)
	}
	s.byText[text] = st
	return st, nil
}

// close closes the statements, for Client.Close, once its leases are
// released; a statement prepared later is closed at once.
func (s *slotStmts) close() {
	s.mu.Lock()
	stmts := s.byText
	s.byText, s.closed = nil, true
	s.mu.Unlock()
	for _, st := range stmts {
		_ = st.Close()
	}
}

func (s *slotStmts) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// execSlot sends slot_acquire's text, prepared once, as exec sends a
// statement: again while the server rolls it back or the connection breaks
// before the reply. maybeApplied reports whether an attempt that failed may
// have committed.
func (c *Client) execSlot(ctx context.Context, text string, args []any) (res sql.Result, maybeApplied bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	st, err := c.slots.stmt(ctx, c.db, text)
	if err != nil {
		return nil, false, err
	}
	var rowBusy bool
	err = retry(ctx, time.Time{}, func() error {
		var err error
		if res, err = st.ExecContext(ctx, args...); err == nil {
			return nil
		}
		if n, ok := serverErrno(err); ok && n == erLockWaitTimeout {
			rowBusy = true // the statement was undone; a slot row stayed locked
			return errRowBusy
		}
		switch classify(err) {
		case failedUnknown:
			maybeApplied = true
		case failedFinal:
			if ctx.Err() != nil {
				maybeApplied = true
			}
		}
		if c.slots.isClosed() {
			return ErrClosed // "sql: statement is closed"
		}
		return err
	})
	if rowBusy {
		return nil, maybeApplied, errRowBusy
	}
	return res, maybeApplied, err
}

// deleteSlotOrphan deletes the slots token may hold in the semaphore whose
// fence row is named p, as deleteOrphan does for a lease.
func (c *Client) deleteSlotOrphan(ctx context.Context, p string, x orphan) bool {
	sent := time.Now()
	sem := strings.TrimSuffix(p, slotMark)
	var res sql.Result
	err := retryTransient(ctx, func() (err error) {
		res, err = c.db.ExecContext(ctx, c.substitute(queries["slot_release"]), p, slotRowsEnd(sem), x.token)
		return err
	})
	if err != nil {
		return false
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false
	}
	settled := n >= 1 || sent.After(x.settled)
	if settled {
		c.unknown(p, true)
	}
	return settled
}

// Slot returns the number of the semaphore slot the lease is on, 1 to n,
// for a Lock taken by [Client.TryAcquireSlot] or [Client.AcquireSlot]; 0
// for a lock's lease.
func (l *Lock) Slot() int {
	_, slot := splitSlotName(l.name)
	return slot
}
