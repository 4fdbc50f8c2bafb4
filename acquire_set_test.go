package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqllock/sqllock/internal/engine"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func mustAcquireSet(t testing.TB, c *Client, ttl time.Duration, names ...string) *Lock {
	t.Helper()
	l, err := c.TryAcquireSet(testCtx(t), names, ttl)
	if err != nil {
		t.Fatalf("TryAcquireSet(%q): %v", names, err)
	}
	return l
}

// wantHeld fails t unless err is a HeldError naming want.
func wantHeld(t testing.TB, err error, want ...string) {
	t.Helper()
	wantErrIs(t, err, ErrNotAcquired)
	var he *HeldError
	if !errors.As(err, &he) {
		t.Fatalf("got %v (%T), want a *HeldError", err, err)
	}
	if !slices.Equal(he.Names, want) {
		t.Fatalf("held names: got %q, want %q", he.Names, want)
	}
}

// skipSetsOnVitess skips a test of sets through Vitess, which refuses
// them (TestClient_TryAcquireSet_refusedThroughVitess).
func skipSetsOnVitess(t *testing.T, e *testEnv) {
	t.Helper()
	if e.server.Vitess {
		t.Skip("sets are refused through Vitess")
	}
}

// Through Vitess a set is refused, after the first use has found Vitess,
// with an error that says why, and nothing is written.
func TestClient_TryAcquireSet_refusedThroughVitess(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if !e.server.Vitess {
			t.Skip("not Vitess")
		}
		a, b := e.twoClients(t)
		_, err := a.TryAcquireSet(testCtx(t), []string{"vt1", "vt2"}, time.Minute)
		wantErrIs(t, err, errors.ErrUnsupported)
		wantErrIs(t, err, ErrUnsupportedServer) // as every refusal of a server
		assertErrContains(t, err, "refused through Vitess", "shards")
		mustAcquire(t, b, "vt1", time.Minute)
		mustAcquire(t, b, "vt2", time.Minute)
	})
}

func TestClient_TryAcquireSet(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		before := mustAcquire(t, a, "y", 10*time.Second)
		if err := before.Release(ctx); err != nil {
			t.Fatal(err)
		}
		la := mustAcquireSet(t, a, 10*time.Second, "z", "x", "y")
		if got, want := la.Names(), []string{"x", "y", "z"}; !slices.Equal(got, want) {
			t.Fatalf("Names: got %q, want %q", got, want)
		}
		fences := la.Fences()
		for i, n := range la.Names() {
			info := inspect(t, b, n)
			if !info.Held || info.Holder != "a" || info.Fence != fences[i] {
				t.Fatalf("Inspect(%q): got %+v, want held by a with fence %d", n, info, fences[i])
			}
		}
		if fences[1] <= before.Fence() {
			t.Fatalf("fence of y: got %d, want more than %d, its fence before", fences[1], before.Fence())
		}
		if !e.oneRow() && (fences[0] != fences[1] || fences[1] != fences[2] || la.Fence() != fences[0]) {
			t.Fatalf("fences: got %d (Fence %d), want one value for the set", fences, la.Fence())
		}

		// A set that shares one name with a's is refused whole: w stays free.
		_, err := b.TryAcquireSet(ctx, []string{"w", "y"}, 10*time.Second)
		wantHeld(t, err, "y")
		if info := inspect(t, b, "w"); info.Held {
			t.Fatalf("Inspect(w) after a refused set: got %+v, want it free", info)
		}
		_, err = b.TryAcquireSet(ctx, []string{"x", "z"}, 10*time.Second)
		wantHeld(t, err, "x", "z")
		_, err = b.TryAcquire(ctx, "x", 10*time.Second)
		wantErrIs(t, err, ErrNotAcquired)

		if err := la.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		lb := mustAcquireSet(t, b, 10*time.Second, "w", "y")
		if lb.Fences()[1] <= fences[1] {
			t.Fatalf("fence of y after a's release: got %d, want more than %d", lb.Fences()[1], fences[1])
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if list, err := a.List(ctx); err != nil || len(list) != 0 {
			t.Fatalf("List after the releases: got %v, %v, want nothing", list, err)
		}
	})
}

// Bad input is refused, and named, before anything is sent.
func TestClient_TryAcquireSet_badInput_noSQL(t *testing.T) {
	many := make([]string, MaxNames+1)
	for i := range many {
		many[i] = fmt.Sprintf("n%d", i)
	}
	tests := []struct {
		name  string
		names []string
		ttl   time.Duration
		want  string
	}{
		{"no names", nil, time.Second, "no lock names"},
		{"empty list", []string{}, time.Second, "no lock names"},
		{"too many", many, time.Second, "65 lock names, more than the 64"},
		{"empty name", []string{"a", ""}, time.Second, "empty lock name"},
		{"long name", []string{strings.Repeat("n", MaxNameLen+1)}, time.Second, "longer than the 255"},
		{"duplicate", []string{"a", "b", "a"}, time.Second, `lock name "a" given twice`},
		{"bad ttl", []string{"a"}, 0, "below the minimum"},
	}
	nop := func(context.Context, *Lock) error { return nil }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			ctx := context.Background()
			_, err := e.c.TryAcquireSet(ctx, tt.names, tt.ttl)
			assertErrContains(t, err, tt.want)
			_, err = e.c.AcquireSet(ctx, tt.names, tt.ttl)
			assertErrContains(t, err, tt.want)
			assertErrContains(t, lockDo(e.c.AcquireSet(ctx, tt.names, tt.ttl))(ctx, nop), tt.want)
			assertErrContains(t, lockDo(e.c.TryAcquireSet(ctx, tt.names, tt.ttl))(ctx, nop), tt.want)
			if err := e.mock.ExpectationsWereMet(); err != nil {
				t.Errorf("ExpectationsWereMet: got %v, want nil", err)
			}
		})
	}
	if _, err := checkNames(many[:MaxNames]); err != nil {
		t.Errorf("checkNames of %d names: got %v, want nil", MaxNames, err)
	}
}

// Lock.Do on a set runs fn under a keep-alive of the whole set; its context
// ends when one lease of the set is lost, and the set is released after.
func TestLock_Do_set(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		a, b := e.twoClients(t, WithLockDelay(0)) // d1 is free once forced free
		ctx := testCtx(t)
		ran := false
		// Renewals every 500 ms, each with 375 ms to answer, and 1.35 s
		// before the keep-alive gives up: a loaded machine keeps it.
		const ttl = 1500 * time.Millisecond
		err := lockDo(a.AcquireSet(ctx, []string{"d1", "d2"}, ttl))(ctx, func(ctx context.Context, _ *Lock) error {
			ran = true
			time.Sleep(ttl + 300*time.Millisecond) // renewed past its first ttl
			if _, err := b.TryAcquire(ctx, "d2", time.Second); !errors.Is(err, ErrNotAcquired) {
				return fmt.Errorf("TryAcquire(d2) within Do: got %v, want ErrNotAcquired", err)
			}
			if _, err := b.ForceRelease(ctx, "d1"); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(5 * time.Second):
				return errors.New("the work's context did not end when a lease of the set was lost")
			}
		})
		if !ran {
			t.Fatalf("Do did not run fn: %v", err)
		}
		wantErrIs(t, err, ErrLockLost)
		// The set's other lease was released: both names are free.
		mustAcquireSet(t, b, time.Minute, "d1", "d2")
		wantErrIs(t, lockDo(a.TryAcquireSet(ctx, []string{"d2", "d3"}, time.Second))(ctx, func(_ context.Context, _ *Lock) error { return nil }), ErrNotAcquired)
	})
}

// Sets that overlap, raced from two processes: nobody ever holds a name
// another holds, no call deadlocks (every call returns, and none with an
// error other than ErrNotAcquired), a refused call leaves nothing behind,
// and each name's fences grow.
func TestClient_TryAcquireSet_overlappingRace(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		a, b := e.twoClients(t)
		raceSets(t, []*Client{a, b}, 4, 40, nil)
	})
}

// raceSets races overlapping sets of 2 to 4 of 5 names, perClient
// goroutines on each of clients making rounds attempts each, holding a set
// a millisecond, and fails t on any error but ErrNotAcquired, on two
// holders of a name at once, on a fence that does not grow, and on a lease
// left at the end, read once caughtUp (if not nil) has returned: a
// cluster's node applies other nodes' releases after they commit.
func raceSets(t *testing.T, clients []*Client, perClient, rounds int, caughtUp func()) {
	t.Helper()
	names := []string{"o1", "o2", "o3", "o4", "o5"}
	var (
		mu     sync.Mutex
		holder = map[string]string{}
		fences = map[string]uint64{}
		took   int
	)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for ci, c := range clients {
		for g := range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(uint64(ci), uint64(g)))
				for range rounds {
					set := slices.Clone(names)
					rnd.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
					set = set[:2+rnd.IntN(3)]
					l, err := c.TryAcquireSet(ctx, set, 5*time.Second)
					if errors.Is(err, ErrNotAcquired) {
						continue
					}
					if err != nil {
						report(err)
						return
					}
					mu.Lock()
					took++
					for i, n := range l.Names() {
						if h := holder[n]; h != "" {
							report(fmt.Errorf("%q taken by %s while %s held it", n, l.Token(), h))
						}
						if f := l.Fences()[i]; f <= fences[n] {
							report(fmt.Errorf("fence of %q: got %d after %d", n, f, fences[n]))
						}
						holder[n], fences[n] = l.Token(), l.Fences()[i]
					}
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
					for _, n := range l.Names() {
						holder[n] = ""
					}
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						report(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if took == 0 {
		t.Fatal("no set was ever taken: the race did not run")
	}
	if caughtUp != nil {
		caughtUp()
	}
	if list, err := clients[0].List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List after the race: got %v, %v, want nothing left", list, err)
	}
	t.Logf("%d sets taken", took)
}

// A set's acquire whose every reply is lost leaves none of its names
// blocked: its cleanup deletes every lease it may have written.
func TestClient_TryAcquireSet_unknownOutcome_namesFreed(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		le := newLateEnv(t, e)
		le.lc.setDecide(func(q string, _ []driver.NamedValue) lateAction {
			if isSetAcquire(q) && !strings.Contains(q, proofLiteral) {
				return lose
			}
			return pass
		})
		_, err := le.c.TryAcquireSet(testCtx(t), []string{"u1", "u2"}, time.Minute)
		if err == nil {
			t.Fatal("TryAcquireSet with every reply lost: got nil, want an error")
		}
		le.lc.setDecide(nil)
		if owner, _ := le.owner(t, "u1"); owner != "" {
			t.Fatalf("u1 after the cleanup: owned by %q, want no lease", owner)
		}
		mustAcquireSet(t, le.witness, time.Minute, "u1", "u2")
	})
}

// proofLiteral begins a proof name's hex literal in a set's statement: the
// set statements' proof (internal/engine/later.go) passes the layers that lose the
// Client's own.
var proofLiteral = strings.TrimSuffix(hexLiteral(engine.ProofPrefix), "'")

// isSetAcquire reports whether query is a set's acquire (all_acquire, with
// MariaDB's prefix or without, or tidb_all_acquire).
func isSetAcquire(query string) bool {
	return strings.Contains(query, "INSERT") && strings.Contains(query, "18446744073709551615")
}

// AcquireSet waits until every name is free, and takes them together; when
// its context ends first, its error says so and that nothing was taken.
func TestClient_AcquireSet_waits(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		first := mustAcquire(t, a, "w1", time.Minute)
		second := mustAcquire(t, a, "w3", time.Minute)
		// b's first set proves its statements first, within the caller's
		// context; the short one below is for the wait alone.
		if err := mustAcquireSet(t, b, time.Minute, "warm1", "warm2").Release(ctx); err != nil {
			t.Fatal(err)
		}

		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := b.AcquireSet(short, []string{"w1", "w2", "w3"}, time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		wantErrIs(t, err, context.DeadlineExceeded)
		if info := inspect(t, a, "w2"); info.Held {
			t.Fatalf("w2 after a refused wait: got %+v, want it free", info)
		}

		got := make(chan error, 1)
		go func() {
			l, err := b.AcquireSet(ctx, []string{"w3", "w2", "w1"}, time.Minute)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(50 * time.Millisecond)
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			t.Fatalf("AcquireSet returned while w3 was still held: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := second.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("AcquireSet after both releases: %v", err)
		}
	})
}

// A waiting AcquireSet or Semaphore.Acquire whose context ends within an attempt
// (within the first use's proof, here: the context ends before it) says
// that nothing was taken, as when it ends while the names are held.
func TestClient_AcquireSet_ctxEndsWithinAttempt(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		c := e.client(t, e.db, e.newTable(t))
		ctx, cancel := context.WithCancel(testCtx(t))
		cancel()
		_, err := c.AcquireSet(ctx, []string{"c1", "c2"}, time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		wantErrIs(t, err, context.Canceled)
		if e.server.TiDB || e.server.Vitess {
			return // no semaphores there
		}
		_, err = c.Semaphore("pool", 2).Acquire(ctx, time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		wantErrIs(t, err, context.Canceled)
	})
}

// A refused TryAcquireSet reads who holds its names, and that look ends
// with the caller's context: on a server that stops answering after the
// refusal, a call whose context ends after 200 ms returns the refusal (no
// holders) within that context and a margin, not after the look's own
// timeout (5 s).
func TestClient_TryAcquireSet_refusedLookEndsWithCtx(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table, WithHolder("holder"))
		c, sc := e.stallingClient(t, table, WithHolder("refused"))
		mustAcquire(t, holder, "b", time.Minute)
		// The first refusal proves the set forms and warms the connection.
		_, err := c.TryAcquireSet(testCtx(t), []string{"a", "b"}, time.Minute)
		wantHeld(t, err, "b")

		sc.armed.Store(true)
		ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
		defer cancel()
		began := time.Now()
		_, err = c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
		took := time.Since(began)
		if !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("TryAcquireSet: got %v, want ErrNotAcquired", err)
		}
		if took > 200*time.Millisecond+time.Second {
			t.Fatalf("refused TryAcquireSet with a 200ms context took %v, want the context and a margin of 1s", took)
		}
	})
}

// stallingConnector connects through a proxy and, once armed, stalls the
// proxy (both ways, as a network partition) when a query is sent: the
// statements before it get their replies, the query and all after it wait.
type stallingConnector struct {
	driver.Connector
	p     *proxy
	armed atomic.Bool
}

func (sc *stallingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := sc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &stallingConn{countedConn: countedConn{passConn: passConn{c}, cc: &countingConnector{}}, sc: sc}, nil
}

type stallingConn struct {
	countedConn
	sc *stallingConnector
}

func (c *stallingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.sc.armed.Load() {
		c.sc.p.Stall(true)
	}
	return c.countedConn.QueryContext(ctx, query, args)
}

// stallingClient returns a Client on table through a proxy that a
// stallingConnector stalls at the first query once armed; the proxy heals
// in t.Cleanup.
func (e *testEnv) stallingClient(t *testing.T, table string, opts ...Option) (*Client, *stallingConnector) {
	t.Helper()
	p := startProxy(t, e.serverAddr(t))
	sc := &stallingConnector{Connector: e.quietConnector(t, func(c *mysql.Config) {
		c.Addr = p.Addr()
		c.TLS, c.TLSConfig = nil, "false"
	}), p: p}
	db := sql.OpenDB(sc)
	t.Cleanup(func() { p.Stall(false); db.Close() })
	return e.client(t, db, table, opts...), sc
}
