package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/observe"
)

// benchCost is BenchmarkFloorRatio's cost: where the time and allocations
// of sqllock's pair go beyond the driver's. Each variant runs one pair per
// iteration beside one floor pair, interleaved as pair does, and adds one
// ingredient of the library to the one before:
//
//   - bare: sqllock's two statements, prepared, without the session guard
//     and MariaDB's lock-wait prefix; fixed name and token;
//   - driver: the statements as the Client prepares them (BenchmarkPair's
//     driver);
//   - token: a fresh token per pair, name, token and ttl boxed once, as the
//     acquire does;
//   - cancel: the release under a cancelable context, which go-sql-driver
//     hands to its watcher goroutine;
//   - timeout: the release under context.WithTimeout(ReleaseTimeout), as
//     Release makes it;
//   - exec: the same through the Client's statement layer (internal/engine);
//   - lock: TryAcquire and the Lock's release on the caller's context
//     (context.Background), without Release's bound;
//   - sqllock: TryAcquire and Release;
//   - observer: the same with an Observer whose every func does nothing.
//
// Off the ladder, unprepared is the driver's statements sent with
// db.ExecContext, which prepares, executes and closes each; and
// names=64/idle=N/token and .../timeout are the token and timeout
// variants run as names=64 runs sqllock, reporting x-floor-rate. It reports
// us-pair (the variant's time per pair), x-floor (that over the floor's)
// and allocs/pair, the variant's alone (ReportAllocs counts the floor's
// too).
func benchCost(b *testing.B, e *testEnv, floor func(*testing.B, int) *sql.Stmt, floorPair func(*sql.Stmt, int) error) {
	ctx := context.Background()
	noop := observe.Observer{
		AcquireDone: func(observe.AcquireEvent) {}, HoldStart: func(observe.HoldEvent) {}, HoldEnd: func(observe.HoldEvent) {},
		Refreshed: func(observe.RefreshEvent) {}, Released: func(observe.ReleaseEvent) {}, Retried: func(observe.RetryEvent) {},
		Unknown: func(observe.UnknownEvent) {}, Wakeup: func(observe.WakeupEvent) {},
	}
	const name, fixedToken = "bench", "0123456789abcdef0123456789abcdef"
	us := benchTTL.Microseconds()

	// direct sends the pair with the driver: acquire and release prepared
	// from text (nil: unprepared), with token's args, the release under
	// rctx.
	type direct struct {
		acquire, release *sql.Stmt
		acqText, relText string
	}
	send := func(c *Client, d direct, nameArg, tokenArg, usArg any, rctx context.Context) error {
		args := []any{nameArg, tokenArg, c.holderArg, usArg, nameArg, tokenArg, c.holderArg, tokenArg, usArg}
		var res sql.Result
		var err error
		if d.acquire != nil {
			res, err = d.acquire.ExecContext(ctx, args...)
		} else {
			res, err = e.db.ExecContext(ctx, d.acqText, args...)
		}
		if err != nil {
			return err
		}
		if id, _ := res.LastInsertId(); id <= 2 {
			return fmt.Errorf("acquire reported %d", id)
		}
		if d.release != nil {
			res, err = d.release.ExecContext(rctx, nameArg, tokenArg)
		} else {
			res, err = e.db.ExecContext(rctx, d.relText, nameArg, tokenArg)
		}
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("release deleted %d rows", n)
		}
		return nil
	}
	prepared := func(b *testing.B, c *Client, guard bool) direct {
		acq, rel := c.eng.Forms().SQL[qAcquire], c.eng.Forms().SQL[qRelease]
		if !guard {
			acq = withoutGuard(b, acq)
		}
		return direct{acquire: mustPrepare(b, e.db, acq), release: mustPrepare(b, e.db, rel)}
	}
	// withToken is a pair as the acquire sends it: a fresh token, each
	// argument boxed once.
	withToken := func(c *Client, d direct, rctx context.Context) error {
		token, err := newToken()
		if err != nil {
			return err
		}
		return send(c, d, any(name), any(token), any(us), rctx)
	}

	variants := []struct {
		name string
		opts []Option
		// setup returns the variant's pair on c.
		setup func(b *testing.B, c *Client) func() error
	}{
		{"bare", nil, func(b *testing.B, c *Client) func() error {
			d := prepared(b, c, false)
			return func() error { return send(c, d, name, fixedToken, us, ctx) }
		}},
		{"driver", nil, func(b *testing.B, c *Client) func() error {
			d := prepared(b, c, true)
			return func() error { return send(c, d, name, fixedToken, us, ctx) }
		}},
		{"token", nil, func(b *testing.B, c *Client) func() error {
			d := prepared(b, c, true)
			return func() error { return withToken(c, d, ctx) }
		}},
		{"cancel", nil, func(b *testing.B, c *Client) func() error {
			d := prepared(b, c, true)
			return func() error {
				rctx, cancel := context.WithCancel(ctx)
				defer cancel()
				return withToken(c, d, rctx)
			}
		}},
		{"timeout", nil, func(b *testing.B, c *Client) func() error {
			d := prepared(b, c, true)
			return func() error {
				rctx, cancel := context.WithTimeout(ctx, ReleaseTimeout)
				defer cancel()
				return withToken(c, d, rctx)
			}
		}},
		{"exec", nil, func(b *testing.B, c *Client) func() error {
			return func() error {
				token, err := newToken()
				if err != nil {
					return err
				}
				nameArg, tokenArg, usArg := any(name), any(token), any(us)
				res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: qAcquire, Args: []any{
					nameArg, tokenArg, c.holderArg, usArg, nameArg, tokenArg, c.holderArg, tokenArg, usArg}})
				if err != nil {
					return err
				}
				if id, _ := res.LastInsertId(); id <= 2 {
					return fmt.Errorf("acquire reported %d", id)
				}
				rctx, cancel := context.WithTimeout(ctx, ReleaseTimeout)
				defer cancel()
				if res, _, err = c.eng.Exec(rctx, engine.Send{Stmt: qRelease, Args: []any{nameArg, tokenArg}}); err != nil {
					return err
				}
				if n, _ := res.RowsAffected(); n != 1 {
					return fmt.Errorf("release deleted %d rows", n)
				}
				return nil
			}
		}},
		{"lock", nil, func(b *testing.B, c *Client) func() error {
			return func() error {
				l, err := c.TryAcquire(ctx, name, benchTTL)
				if err != nil {
					return err
				}
				return l.release(ctx, 0, nil)
			}
		}},
		{"sqllock", nil, func(b *testing.B, c *Client) func() error {
			return func() error {
				l, err := c.TryAcquire(ctx, name, benchTTL)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			}
		}},
		{"observer", []Option{WithObserver(noop)}, func(b *testing.B, c *Client) func() error {
			return func() error {
				l, err := c.TryAcquire(ctx, name, benchTTL)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			}
		}},
		{"unprepared", nil, func(b *testing.B, c *Client) func() error {
			d := direct{acqText: c.eng.Forms().SQL[qAcquire], relText: c.eng.Forms().SQL[qRelease]}
			return func() error { return withToken(c, d, ctx) }
		}},
	}
	// At 64 goroutines on names of their own, as names=64 runs sqllock:
	// the driver's pair with a fresh token, its release on the caller's
	// context and under Release's bound.
	for _, idle := range []int{2, 64} {
		for _, bound := range []bool{false, true} {
			v := "token"
			if bound {
				v = "timeout"
			}
			b.Run(fmt.Sprintf("names=64/idle=%d/%s", idle, v), func(b *testing.B) {
				var once sync.Once
				var d direct
				pair := func(c *Client, name string) error {
					once.Do(func() { d = prepared(b, c, true) })
					token, err := newToken()
					if err != nil {
						return err
					}
					rctx := ctx
					if bound {
						var cancel context.CancelFunc
						rctx, cancel = context.WithTimeout(ctx, ReleaseTimeout)
						defer cancel()
					}
					return send(c, d, any(name), any(token), any(us), rctx)
				}
				benchNames64(b, e, idle, floor, floorPair, pair)
			})
		}
	}

	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			up := floor(b, 1)
			c := e.newClient(b, v.opts...)
			// The first use (check, proof, the server's forms) comes first.
			mustAcquire(b, c, "warm", time.Second).Release(ctx)
			pair := v.setup(b, c)
			if err := pair(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			inFloor, inPair := interleaved(b, func() error { return floorPair(up, 0) }, pair)
			b.ReportMetric(float64(inPair)/float64(inFloor), "x-floor")
			b.ReportMetric(float64(inPair.Microseconds())/float64(b.N), "us-pair")
			b.ReportMetric(testing.AllocsPerRun(100, func() {
				if err := pair(); err != nil {
					b.Fatal(err)
				}
			}), "allocs/pair")
		})
	}
}

// withoutGuard returns the acquire statement q without MariaDB's lock-wait
// prefix and without the session guard's terms (queries.sql), for the
// bare variant: what the guard costs the server.
func withoutGuard(b *testing.B, q string) string {
	b.Helper()
	q = strings.TrimPrefix(q, queries["lock_wait_mariadb"]+"\n")
	const term = "+ (18446744073709551615 "
	for {
		i := strings.Index(q, term)
		if i < 0 {
			return q
		}
		depth, j := 0, i+2
		for ; j < len(q); j++ {
			if q[j] == '(' {
				depth++
			} else if q[j] == ')' {
				if depth--; depth == 0 {
					break
				}
			}
		}
		rest, ok := strings.CutPrefix(q[j+1:], " * 0")
		if !ok {
			b.Fatalf("the session guard in %s does not end in * 0", q)
		}
		q = q[:i] + rest
	}
}
