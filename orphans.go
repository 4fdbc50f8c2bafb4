package sqllock

import (
	"context"
	"errors"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/settle"
)

// The tokens whose leases may be left on the server (an acquire whose
// outcome stays unknown, a Lock whose acquire was sent more than once) are
// remembered in one of the Client's two orphan lists, names' (by name) or
// semaphores' (by semaphore: the token may hold any of its slots), and
// settled by internal/settle's one rule; this file sends their DELETEs.
// Every later acquire first deletes the leases its tokens may hold
// (claimOrphans), and Close deletes them all (releaseOrphans). The
// package's comment gives the rule and its bound.

// An orphan is a token an orphan list remembers.
type orphan = settle.Token

// An orphanList is the orphan list of one kind of lease: a settle.Book, and
// the DELETE of what a token may hold under one of its keys.
type orphanList interface {
	book() *settle.Book
	deleteByToken(ctx context.Context, c *Client, key, token string) (int64, error)
}

// nameOrphans is the orphan list of names' leases, keyed by name.
type nameOrphans struct{ settle.Book }

// semOrphans is the orphan list of semaphores' slots, keyed by the
// semaphore's name (semaphore.go deletes them).
type semOrphans struct{ settle.Book }

func (o *nameOrphans) book() *settle.Book { return &o.Book }
func (o *semOrphans) book() *settle.Book  { return &o.Book }

// newOrphan returns token, of an acquire for ttl whose last send was at
// last at the latest; once says that only one of its sends may have
// committed.
func newOrphan(token string, ttl time.Duration, last time.Time, once bool) orphan {
	return settle.NewToken(token, ttl, last, once)
}

// orphanWait bounds how long after it was sent a cut acquire may still
// commit on the server (settle.Wait).
const orphanWait = settle.Wait

// deleteOrphan deletes what x may hold under key of list, and reports
// whether that settles it (settle.Delete).
func (c *Client) deleteOrphan(ctx context.Context, list orphanList, key string, x orphan) bool {
	if !settle.Delete(ctx, x, func(ctx context.Context, token string) (int64, error) { return list.deleteByToken(ctx, c, key, token) }) {
		return false
	}
	c.unknown(key, true)
	return true
}

// deleteByToken deletes the lease token holds on name and returns how many
// rows went.
func (*nameOrphans) deleteByToken(ctx context.Context, c *Client, name, token string) (int64, error) {
	res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: qRelease, Args: []any{name, token}})
	if errors.Is(err, ErrClosed) {
		// Close has closed the statements, or this Client never
		// prepared the release; the *sql.DB is still open: send it
		// unprepared.
		err = fault.Transient(ctx, func() (err error) {
			res, err = c.db.ExecContext(ctx, c.eng.Forms().SQL[qRelease], name, token)
			return err
		})
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// claimOrphans deletes the leases that acquires with an unknown outcome
// may have left under key of list, before this Client acquires it again;
// the tokens that stay unsettled are remembered again. It sends nothing
// when there are none.
func (c *Client) claimOrphans(ctx context.Context, list orphanList, key string) {
	list.book().Claim(key, func(x orphan) bool { return c.deleteOrphan(ctx, list, key, x) })
}

// releaseOrphans deletes the leases of every remembered token, for Close,
// until ctx ends. Whatever fails expires by itself.
func (c *Client) releaseOrphans(ctx context.Context) {
	now := time.Now()
	for _, list := range []orphanList{&c.orphans, &c.semOrphans} {
		for key, xs := range list.book().TakeAll() {
			for _, x := range xs {
				if now.Before(x.Expires) {
					c.deleteOrphan(ctx, list, key, x)
				}
			}
		}
	}
}

// releaseOrphansOf deletes the leases of the tokens remembered under key
// of list, with a context of its own, for a token remembered once Close
// has started: Close's pass over the lists may have run already. Whatever
// fails expires by itself.
func (c *Client) releaseOrphansOf(list orphanList, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, x := range list.book().Take(key, time.Now()) {
		c.deleteOrphan(ctx, list, key, x)
	}
}
