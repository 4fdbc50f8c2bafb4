package sqllocktest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// On the MariaDB flavour, an acquire behind a holder's Check transaction
// reports the name held once its statement's second of lock wait has
// passed, while the transaction is still open (the row lock outlives the
// lease: a holder frozen inside the transaction); a name's, a set's and a
// semaphore's alike. The MySQL flavour's waits for the transaction, and
// takes the expired lease over once it commits (TestServer_check).
func TestWithMariaDB_heldBehindCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hold takes the lease that a Check's transaction then locks, and
		// take tries to acquire it from another Client; expire, when not
		// "", is a name whose lease has run out under the transaction.
		hold   func(ctx context.Context, c *sqllock.Client) (*sqllock.Lock, error)
		take   func(ctx context.Context, c *sqllock.Client) error
		expire string
	}{{
		name:   "name",
		expire: "job",
		hold: func(ctx context.Context, c *sqllock.Client) (*sqllock.Lock, error) {
			return c.TryAcquire(ctx, "job", time.Minute)
		},
		take: func(ctx context.Context, c *sqllock.Client) error {
			_, err := c.TryAcquire(ctx, "job", time.Minute)
			return err
		},
	}, {
		name: "set",
		hold: func(ctx context.Context, c *sqllock.Client) (*sqllock.Lock, error) {
			return c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
		},
		take: func(ctx context.Context, c *sqllock.Client) error {
			_, err := c.TryAcquireSet(ctx, []string{"b", "c"}, time.Minute)
			return err
		},
	}, {
		name: "semaphore",
		hold: func(ctx context.Context, c *sqllock.Client) (*sqllock.Lock, error) {
			return c.Semaphore("pool", 1).TryAcquire(ctx, time.Minute)
		},
		take: func(ctx context.Context, c *sqllock.Client) error {
			_, err := c.Semaphore("pool", 1).TryAcquire(ctx, time.Minute)
			return err
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := sqllocktest.New(t, sqllocktest.WithMariaDB())
			ctx := ctxFor(t)
			l, err := tc.hold(ctx, newClient(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			tx := checkedTx(t, ctx, srv, l)
			if tc.expire != "" {
				if err := srv.Expire(tc.expire); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			err = tc.take(ctx, newClient(t, srv))
			if !errors.Is(err, sqllock.ErrNotAcquired) || ctx.Err() != nil {
				t.Fatalf("behind an open Check: got %v, want ErrNotAcquired (held) before the context ended", err)
			}
			// The server's own timer, never early: a lower bound only.
			if d := time.Since(start); d < time.Second {
				t.Errorf("held after %v, want after the statement's second of lock wait", d)
			}
			// It answered while the transaction still held the row.
			if err := tx.Commit(); err != nil {
				t.Fatalf("the Check's transaction: %v", err)
			}
		})
	}
}

// The MariaDB flavour says it is MariaDB 10.11.
func TestWithMariaDB_version(t *testing.T) {
	srv := sqllocktest.New(t, sqllocktest.WithMariaDB())
	db := srv.DB()
	var v string
	if err := db.QueryRowContext(ctxFor(t), "SELECT VERSION()").Scan(&v); err != nil || v != sqllocktest.MariaDBVersion {
		t.Fatalf("VERSION(): got %q, %v, want %q", v, err, sqllocktest.MariaDBVersion)
	}
}
