package sqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Info describes the lease on one name as the server sees it.
type Info struct {
	Name string
	// Slot is, for a slot of a counting semaphore ([Semaphore.TryAcquire]),
	// the slot's number, 1 to n, and Name the semaphore's; 0 for a lock.
	Slot int
	// Holder is the description of the Client whose lease is on the name
	// (see [WithHolder]), live or expired; empty once it was released.
	// A lock-delay's reads "lock-delay after a forced release of HOLDER".
	Holder string
	// Fence is the last fencing token issued for the name (a slot's is its
	// semaphore's), kept across releases; 0 when the name was never taken.
	Fence uint64
	// Held reports whether a lease on the name is live now.
	Held bool
	// TTL is how long the live lease has left by the server's clock; 0 when
	// Held is false.
	TTL time.Duration
	// Age is how long the live lease has been held by the server's clock:
	// since its acquire (renewals do not reset it); 0 when Held is false,
	// or when it was acquired on a node whose clock is ahead.
	Age time.Duration
	// LockDelay is, from [Client.ForceRelease], how long the name stays
	// taken; 0 when it is free.
	LockDelay time.Duration
	// MinHold reports, from [Client.Inspect], that the live lease is what a
	// release with a minimum hold left ([WithMinHold]): its holder's work
	// has ended, and the lease keeps the name taken for TTL more, held by
	// nobody.
	MinHold bool
}

// leaseAge is the Age of a lease acquired aheadUs microseconds ahead of
// the server's now (negative: in the past).
func leaseAge(aheadUs int64) time.Duration {
	return time.Duration(max(-aheadUs, 0)) * time.Microsecond
}

// Inspect reads the lease on name in one statement. A name nobody holds
// comes back with Held false and no error.
func (c *Client) Inspect(ctx context.Context, name string) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	st, err := c.eng.Stmt(ctx, qInspect)
	if err != nil {
		return Info{}, c.serverError(fmt.Sprintf("inspect %q", name), err)
	}
	info := Info{Name: name}
	var (
		holder        sql.NullString
		held, minHold sql.NullBool
		us, aheadUs   sql.NullInt64
	)
	err = st.QueryRowContext(ctx, name).Scan(&holder, &info.Fence, &held, &us, &aheadUs, &minHold)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return info, nil
	case err != nil:
		return Info{}, c.serverError(fmt.Sprintf("inspect %q", name), err)
	}
	c.noteAhead(name, aheadUs.Int64, aheadUs.Valid)
	info.Holder = holder.String
	info.Held = held.Bool
	if info.Held {
		info.TTL = time.Duration(us.Int64) * time.Microsecond
		info.Age = leaseAge(aheadUs.Int64)
		info.MinHold = minHold.Bool
	}
	return info, nil
}

// List returns every live lease in the Client's table, whoever holds it, in
// name order, as one statement reads them (a slot with its semaphore's
// fence). It reads the whole table, so it is for people and dashboards, not
// for a hot path.
func (c *Client) List(ctx context.Context) ([]Info, error) {
	st, err := c.eng.Stmt(ctx, qList)
	if err != nil {
		return nil, c.serverError("list", err)
	}
	rows, err := st.QueryContext(ctx)
	if err != nil {
		return nil, c.serverError("list", err)
	}
	defer rows.Close()
	var infos []Info
	for rows.Next() {
		info := Info{Held: true}
		var us, aheadUs int64
		if err := rows.Scan(&info.Name, &info.Holder, &info.Fence, &us, &aheadUs); err != nil {
			return nil, c.serverError("list", err)
		}
		c.noteAhead(info.Name, aheadUs, true)
		info.TTL = time.Duration(us) * time.Microsecond
		info.Age = leaseAge(aheadUs)
		info.Name, info.Slot = slotOfRow(info.Name) // a slot's fence is its semaphore's
		infos = append(infos, info)
	}
	if err := rows.Err(); err != nil {
		return nil, c.serverError("list", err)
	}
	return infos, nil
}

// forceReleaseAttempts bounds how often ForceRelease reads the lease again
// when its holder changed between the read and the write.
const forceReleaseAttempts = 5

// ForceRelease takes the lease on name from whoever holds it, live or
// expired, and returns what it was, with LockDelay: how long the name stays
// taken. A live lease is put under a lock-delay (see [WithLockDelay]): no
// acquire takes the name until the evicted holder's next renewal has found
// it gone and its work has stopped; an expired one is deleted. The fence row
// stays, so the next holder's fence is higher. It writes by the owner token
// it read: a holder that took the name since is never touched. It returns an
// error wrapping [ErrNotHeld] when the name has no lease.
func (c *Client) ForceRelease(ctx context.Context, name string) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	return c.forceRelease(ctx, name, name, fmt.Sprintf("%q", name))
}

// forceRelease is ForceRelease of the lease row named row, whose waiting
// callers wait in the queue key, and which label names in errors.
func (c *Client) forceRelease(ctx context.Context, row, key, label string) (Info, error) {
	op := "force release " + label
	delayOwner, err := newDelayOwner()
	if err != nil {
		return Info{}, errorf("%s: %w", op, err)
	}
	var (
		prev      Info   // the lease a write whose reply was lost may have freed
		prevOwner string // its owner
	)
	for range forceReleaseAttempts {
		info, owner, attached, err := c.lease(ctx, row)
		if err != nil {
			return Info{}, c.serverError(op, err)
		}
		switch {
		case prevOwner != "" && owner == delayOwner:
			prev.LockDelay = info.TTL // that lock-delay went in
			return prev, nil
		case prevOwner != "" && owner != prevOwner:
			return prev, nil // that delete went through
		case owner == "":
			return Info{}, errorf("%w: %s has no lease to release", ErrNotHeld, label)
		}
		delay, keep := c.lockDelayFor(info, owner)
		if keep {
			info.LockDelay = info.TTL
			return info, nil
		}
		x := engine.Send{Stmt: qRelease, Args: []any{row, owner}}
		if info.Held && !c.eng.Forms().OneRow {
			// Not an attached lease (queries.sql), which may have been
			// attached since the read.
			h := sqltext.Hex
			x = engine.Send{Stmt: engine.Text, Label: "force_release", Name: row,
				Text: c.eng.Forms().Text().Set("force_release", h(row), h(owner))}
		}
		if delay != 0 || attached && info.Held {
			// An attached lease ends by lock_delay even with no delay,
			// which counts the change in its session: a delete would
			// not, and its holder would not be told.
			x = engine.Send{Stmt: qLockDelay, Args: []any{delayArg(delay), delayOwner, delayHolder(info.Holder, owner), row, owner}}
		}
		res, unknown, err := c.eng.Exec(ctx, x)
		if unknown > 0 {
			prev, prevOwner = info, owner
		}
		if err != nil {
			return Info{}, c.serverError(op, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return Info{}, errorf("%s: %w", op, err)
		}
		if n == 0 {
			continue // released or taken over since the read: look again
		}
		if delay == 0 {
			if x.Stmt == qLockDelay {
				// An attached lease, ended by lock_delay with no delay:
				// its row, the lock-delay's now and already over, is
				// deleted, as force_release deletes an unattached one,
				// so that both leave the table alike. Should this fail,
				// the row left blocks nobody.
				_, _, _ = c.eng.Exec(ctx, engine.Send{Stmt: qRelease, Args: []any{row, delayOwner}})
			}
			// A waiter in this Client may take the name (or slot) now.
			c.wait.Kick(key)
			return info, nil
		}
		us, err := res.LastInsertId()
		if err != nil {
			return Info{}, errorf("%s: %w", op, err)
		}
		info.LockDelay = time.Duration(us) * time.Microsecond
		return info, nil
	}
	return Info{}, errorf("%s: the lease changed hands %d times while being released; try again", op, forceReleaseAttempts)
}

// lockDelayCap bounds the second term of the default lock-delay: the
// default safety margin's cap, and a second for the round trips.
const lockDelayCap = maxDefaultSafetyMargin + time.Second

// defaultLockDelay is the lock-delay that lock_delay computes on the server
// when none is set, for a lease with r left: r/3 + min(r/5, lockDelayCap).
//
// Why: a keep-alive (KeepAlive, Do, Elect, Once) renews for its ttl every
// ttl/3, counted from the previous renewal's reply (keepalive.go), so its
// renewals reach the server at most ttl/3 + ρ apart, ρ a round trip, and
// the lease has 2ttl/3 - ρ <= r <= ttl left at any moment (more only after
// a longer Refresh, which renewals never shorten, and which only makes the
// next renewal come sooner than r/3). The next renewal reaches the server
// within r - (2ttl/3 - ρ) <= r/3 + ρ, finds the lease not its own, and the
// keep-alive ends the work's context with ErrLockLost at its reply. The
// work then needs the time the safety margin grants it before a lease could
// lapse, min(ttl/10, 5 s), which ttl <= 3(r + ρ)/2 bounds by 0.15(r + ρ)
// and by 5 s. So r/3 + min(r/5, 6 s) covers both and leaves the round trips
// 0.05r, or 1 s when r is 30 s or more. A holder whose renewals fail stops
// at its own deadline, its margin before r; a holder with a larger margin
// (WithSafetyMargin, sqllock run's --kill-grace), or none of these
// keep-alives, needs WithLockDelay.
func defaultLockDelay(r time.Duration) time.Duration {
	r = max(r, 0)
	return r/3 + min(r/5, lockDelayCap)
}

// lockDelayFor returns the lock-delay a forced release leaves on the lease
// info, of owner: -1 for the default, which the statement computes, 0 for
// none (the lease is deleted); keep when a lock-delay in place stays as it
// is.
func (c *Client) lockDelayFor(info Info, owner string) (delay time.Duration, keep bool) {
	switch {
	case !info.Held:
		return 0, false // expired: nobody can be working under it
	case c.lockDelay >= 0:
		return c.lockDelay, false
	case isDelayOwner(owner):
		return 0, true // a second forced release: the first one's delay stands
	case len(owner) != 2*tokenBytes:
		return 0, false // released with a minimum hold (releasedToken): its work is done
	}
	return -1, false
}

// delayArg is lock_delay's first argument for delay: NULL for the default.
func delayArg(delay time.Duration) any {
	if delay < 0 {
		return nil
	}
	return delay.Microseconds()
}

// delayOwnerPrefix begins the owner of a lock-delay: no token (32 hex
// digits), nor a token's released form (base64, without '-'), equals it.
const delayOwnerPrefix = "lock-delay/"

// newDelayOwner returns the owner of a new lock-delay: its prefix and 80
// random bits, 31 bytes, so that a forced release knows its own lock-delay
// when its reply was lost, and a later one's never for it.
func newDelayOwner() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return delayOwnerPrefix + hex.EncodeToString(b[:]), nil
}

func isDelayOwner(owner string) bool { return strings.HasPrefix(owner, delayOwnerPrefix) }

// lockDelayHolder begins the holder of a lock-delay, which ends with the
// evicted holder's.
const lockDelayHolder = "lock-delay after a forced release of "

// delayHolder returns the holder a lock-delay on the lease of holder and
// owner shows: the one it has when it is a lock-delay already.
func delayHolder(holder, owner string) string {
	if isDelayOwner(owner) {
		return holder
	}
	h := lockDelayHolder + holder
	if len(h) > maxHolderLen {
		h = strings.ToValidUTF8(h[:maxHolderLen], "")
	}
	return h
}

// lease reads the lease row of name with its owner token, and whether it
// is attached: it ends with its holder's session (queries.sql); owner is
// empty when there is no lease row.
func (c *Client) lease(ctx context.Context, name string) (info Info, owner string, attached bool, err error) {
	st, err := c.eng.Stmt(ctx, qLease)
	if err != nil {
		return Info{}, "", false, err
	}
	var (
		ownerB []byte
		us     sql.NullInt64
	)
	info.Name = name
	err = st.QueryRowContext(ctx, name).Scan(&ownerB, &info.Holder, &info.Fence, &info.Held, &us, &attached)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Info{}, "", false, nil
	case err != nil:
		return Info{}, "", false, err
	}
	if info.Held {
		info.TTL = time.Duration(us.Int64) * time.Microsecond
	}
	return info, string(ownerB), attached, nil
}

// ResetOnce deletes the completion record [Client.Once] wrote for name, so
// that the next Once of name runs its function again, and reports whether
// there was one. A Once running now is not stopped; it writes its record
// again when its function succeeds.
func (c *Client) ResetOnce(ctx context.Context, name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: qOnceReset, Args: []any{name}})
	if err != nil {
		return false, c.serverError(fmt.Sprintf("reset once %q", name), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, errorf("reset once %q: %w", name, err)
	}
	return n == 1, nil
}
