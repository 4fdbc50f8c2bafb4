package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

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
			c.waiters.kick(name)
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
