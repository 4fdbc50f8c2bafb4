package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Info describes the lease on one name as the server sees it.
type Info struct {
	Name string
	// Slot is, for a slot of a counting semaphore ([Semaphore.TryAcquire]),
	// the slot's number, 1 to n, and Name the semaphore's; 0 for a lock.
	Slot int
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
	// Age is how long the live lease has been held by the server's clock:
	// since its acquire (renewals do not reset it); 0 when Held is false,
	// or when it was acquired on a node whose clock is ahead.
	Age time.Duration
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
	st, err := c.stmt(ctx, qInspect)
	if err != nil {
		return Info{}, c.serverError(fmt.Sprintf("inspect %q", name), err)
	}
	info := Info{Name: name}
	var (
		holder      sql.NullString
		held        sql.NullBool
		us, aheadUs sql.NullInt64
	)
	err = st.QueryRowContext(ctx, name).Scan(&holder, &info.Fence, &held, &us, &aheadUs)
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
	}
	return info, nil
}

// List returns every live lease in the Client's table, whoever holds it, in
// name order, as one statement reads them. It reads the whole table, so it
// is for people and dashboards, not for a hot path.
func (c *Client) List(ctx context.Context) ([]Info, error) {
	st, err := c.stmt(ctx, qList)
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
		info.Name, info.Slot = splitSlotName(info.Name) // a slot's fence is 0: see Client.InspectSlots
		infos = append(infos, info)
	}
	if err := rows.Err(); err != nil {
		return nil, c.serverError("list", err)
	}
	return infos, nil
}

// forceReleaseAttempts bounds how often ForceRelease reads the lease again
// when its holder changed between the read and the delete.
const forceReleaseAttempts = 5

// ForceRelease deletes the lease on name whoever holds it, live or expired,
// and returns what it was: its holder, the name's fence, whether it was live
// and how long it had left. It is for operators freeing a name whose holder
// is stuck; that holder's next renewal reports [ErrNotHeld], and its
// keep-alive ends its work with [ErrLockLost]. The fence row stays, so the
// next holder's fence is still higher than the evicted one's.
//
// It reads the lease's owner token, then deletes by that token, so a holder
// that took the name in between is never deleted in its place (it reads
// again, a few times). It returns an error wrapping [ErrNotHeld] when the
// name has no lease row.
func (c *Client) ForceRelease(ctx context.Context, name string) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	op := fmt.Sprintf("force release %q", name)
	var (
		prev      Info   // the lease a delete whose reply was lost may have deleted
		prevOwner string // its owner
	)
	for range forceReleaseAttempts {
		info, owner, err := c.lease(ctx, name)
		if err != nil {
			return Info{}, c.serverError(op, err)
		}
		if prevOwner != "" && owner != prevOwner {
			return prev, nil // that delete went through
		}
		if owner == "" {
			return Info{}, errorf("%w: %q has no lease to release", ErrNotHeld, name)
		}
		res, maybeApplied, err := c.exec(ctx, qRelease, name, owner)
		if maybeApplied {
			prev, prevOwner = info, owner
		}
		if err != nil {
			return Info{}, c.serverError(op, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return Info{}, errorf("%s: %w", op, err)
		} else if n == 1 {
			// A waiter in this Client may take the name now.
			c.wait.Queues.Kick(name)
			return info, nil
		}
		// Released or taken over since the read: look again.
	}
	return Info{}, errorf("%s: the lease changed hands %d times while being released; try again", op, forceReleaseAttempts)
}

// lease reads the lease row of name with its owner token; owner is empty
// when there is no lease row.
func (c *Client) lease(ctx context.Context, name string) (info Info, owner string, err error) {
	st, err := c.stmt(ctx, qLease)
	if err != nil {
		return Info{}, "", err
	}
	var (
		ownerB []byte
		us     sql.NullInt64
	)
	info.Name = name
	err = st.QueryRowContext(ctx, name).Scan(&ownerB, &info.Holder, &info.Fence, &info.Held, &us)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Info{}, "", nil
	case err != nil:
		return Info{}, "", err
	}
	if info.Held {
		info.TTL = time.Duration(us.Int64) * time.Microsecond
	}
	return info, string(ownerB), nil
}

// ResetOnce deletes the completion record [Client.Once] wrote for name, so
// that the next Once of name runs its function again, and reports whether
// there was one. A Once running now is not stopped; it writes its record
// again when its function succeeds.
func (c *Client) ResetOnce(ctx context.Context, name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	res, _, err := c.exec(ctx, qOnceReset, name)
	if err != nil {
		return false, c.serverError(fmt.Sprintf("reset once %q", name), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, errorf("reset once %q: %w", name, err)
	}
	return n == 1, nil
}
