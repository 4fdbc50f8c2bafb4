package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/settle"
)

// The tokens whose leases may be left on the server (an acquire whose
// outcome stays unknown, a Lock whose acquire was sent more than once) are
// remembered in the Client's settle.Book, by name, or by a semaphore's
// rows (orphanKey), and settled by the package's one rule; this file sends
// their DELETEs. Every later acquire of a name first deletes the leases its
// tokens may hold (claimOrphans), and Close deletes them all
// (releaseOrphans). The package's comment gives the rule and its bound.

// An orphan is a token settle.Book remembers.
type orphan = settle.Token

// newOrphan returns token, of an acquire for ttl whose last send was at
// last at the latest; once says that only one of its sends may have
// committed.
func newOrphan(token string, ttl time.Duration, last time.Time, once bool) orphan {
	return settle.NewToken(token, ttl, last, once)
}

// orphanWait bounds how long after it was sent a cut acquire may still
// commit on the server (settle.Wait).
const orphanWait = settle.Wait

// deleteOrphan deletes the lease x may hold on name, or the slot it may
// hold in the semaphore whose fence row name is, and reports whether that
// settles it (settle.Delete).
func (c *Client) deleteOrphan(ctx context.Context, name string, x orphan) bool {
	if !settle.Delete(ctx, x, func(ctx context.Context, token string) (int64, error) { return c.deleteByToken(ctx, name, token) }) {
		return false
	}
	c.unknown(name, true)
	return true
}

// deleteByToken deletes the lease token holds on name, or any slot it holds
// in the semaphore whose fence row name is, and returns how many rows went.
func (c *Client) deleteByToken(ctx context.Context, name, token string) (int64, error) {
	var res sql.Result
	var err error
	if sem, ok := strings.CutSuffix(name, slotMark); ok {
		err = fault.Transient(ctx, func() (err error) {
			res, err = c.db.ExecContext(ctx, c.eng.Text().Substitute(queries["slot_release"]), name, slotRowsEnd(sem), token)
			return err
		})
	} else {
		res, _, err = c.eng.Exec(ctx, engine.Send{Stmt: qRelease, Args: []any{name, token}})
		if errors.Is(err, ErrClosed) {
			// Close has closed the statements, or this Client never
			// prepared the release; the *sql.DB is still open: send it
			// unprepared.
			err = fault.Transient(ctx, func() (err error) {
				res, err = c.db.ExecContext(ctx, c.eng.Forms().SQL[qRelease], name, token)
				return err
			})
		}
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// claimOrphans deletes the leases that acquires of name with an unknown
// outcome may have left, before this Client acquires name again; the tokens
// that stay unsettled are remembered again. It sends nothing when there are
// none.
func (c *Client) claimOrphans(ctx context.Context, name string) {
	c.orphans.Claim(name, func(x orphan) bool { return c.deleteOrphan(ctx, name, x) })
}

// releaseOrphans deletes the leases of every remembered token, for Close,
// until ctx ends. Whatever fails expires by itself.
func (c *Client) releaseOrphans(ctx context.Context) {
	now := time.Now()
	for name, xs := range c.orphans.TakeAll() {
		for _, x := range xs {
			if now.Before(x.Expires) {
				c.deleteOrphan(ctx, name, x)
			}
		}
	}
}

// releaseOrphansOf deletes the leases of the tokens remembered for name,
// with a context of its own, for a token remembered once Close has started:
// Close's pass over the list may have run already. Whatever fails expires
// by itself.
func (c *Client) releaseOrphansOf(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, x := range c.orphans.Take(name, time.Now()) {
		c.deleteOrphan(ctx, name, x)
	}
}
