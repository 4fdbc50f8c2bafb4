package sqllock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Fault injection: a connection cut between a statement and its reply, a
// reply later than the lease, a stalled network, a connection killed by the
// server, and (opt-in) a server restart. In each, a holder must never be
// told it holds a lease that another holds, nor lose its own lock to a
// retry. A second Client, connected directly, is the witness.

// The reply to an acquire is lost after the server ran it: the retry, with
// the same token, must return the lease the first attempt took, with its
// fence, not refuse it as another owner's nor take a second one.
func TestFaults_cutAfterAcquire(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		for _, tc := range []struct {
			name string
			warm bool // statements already prepared on a live connection
		}{{"cold", false}, {"warm", true}} {
			t.Run(tc.name, func(t *testing.T) {
				name := "acquire-" + tc.name
				if tc.warm {
					if err := mustAcquire(t, f.c, name, time.Minute).Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				before := inspect(t, f.witness, name).Fence
				f.p.ResetCounts()
				f.p.CutAfterCommand(proxyComStmtExecute, 1)
				l, err := f.c.TryAcquire(ctx, name, time.Minute)
				if err != nil {
					t.Fatalf("TryAcquire through a cut reply: %v", err)
				}
				f.wantRetried(t)
				if l.Fence() <= before {
					t.Fatalf("got fence %d, want above %d", l.Fence(), before)
				}
				f.wantHeldBy(t, l)
				if err := l.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
				f.wantFree(t, name, l.Fence())
			})
		}
	})
}

// The reply to a refresh is lost: the retry extends the same lease again,
// and the lease stays the holder's.
func TestFaults_cutAfterRefresh(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		l := mustAcquire(t, f.c, "refresh", 5*time.Second)
		f.p.ResetCounts()
		f.p.CutAfterCommand(proxyComStmtExecute, 1)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh through a cut reply: %v", err)
		}
		f.wantRetried(t)
		f.wantHeldBy(t, l)
		if got := inspect(t, f.witness, "refresh"); got.TTL < 50*time.Second {
			t.Fatalf("TTL after Refresh(1m): got %v, want about 1m", got.TTL)
		}
		if d := time.Until(l.ValidUntil()); d < 50*time.Second {
			t.Fatalf("ValidUntil is %v away, want about 1m", d)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		f.wantFree(t, "refresh", l.Fence())
	})
}

// The reply to a release is lost after the row was deleted: the retry finds
// no row, and since the lease was certainly live when it was sent, Release
// reports success, not ErrNotHeld.
func TestFaults_cutAfterRelease(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		l := mustAcquire(t, f.c, "release", time.Minute)
		f.p.ResetCounts()
		f.p.CutAfterCommand(proxyComStmtExecute, 1)
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release through a cut reply: %v", err)
		}
		f.wantRetried(t)
		if got := inspect(t, f.witness, "release"); got.Held {
			t.Fatalf("after Release: got %+v, want not held", got)
		}
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		f.wantFree(t, "release", l.Fence())
	})
}

// Every reply comes later than the lease lasts. The holder is told it
// acquired, but ValidUntil is already past when it is told, so it can know
// not to rely on it; the next holder gets a higher fence, and the late
// holder's Refresh and Release report the loss.
func TestFaults_latencyBeyondLease(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		const ttl = 100 * time.Millisecond
		// Warm: prepared statements on a live connection, so the latency
		// falls on the statements alone.
		if err := mustAcquire(t, f.c, "slow", ttl).Release(ctx); err != nil {
			t.Fatal(err)
		}
		f.p.Latency(3 * ttl)
		l := mustAcquire(t, f.c, "slow", ttl)
		if now := time.Now(); !now.After(l.ValidUntil()) {
			t.Fatalf("ValidUntil %v after a reply slower than the lease, want it past (now %v)", l.ValidUntil(), now)
		}
		next := mustAcquire(t, f.witness, "slow", time.Minute)
		if next.Fence() <= l.Fence() {
			t.Fatalf("next holder's fence %d, want above the late holder's %d", next.Fence(), l.Fence())
		}
		wantErrIs(t, l.Refresh(ctx, time.Minute), ErrNotHeld)
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		f.p.Latency(0)
		if got := inspect(t, f.witness, "slow"); !got.Held || got.Fence != next.Fence() || got.Holder != "witness" {
			t.Fatalf("got %+v, want the next holder's lease untouched", got)
		}
	})
}

// The network stalls while the holder refreshes; its lease runs out and
// another holder takes the name. When the network heals, the held refresh
// reaches the server late: the token guard must keep it from touching the
// new lease, and the old holder must learn it lost.
func TestFaults_stallDuringRefresh(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		const ttl = 200 * time.Millisecond
		l := mustAcquire(t, f.c, "stall", ttl)
		f.p.Stall(true)
		ctx, cancel := context.WithTimeout(context.Background(), 2*ttl)
		err := l.Refresh(ctx, time.Minute)
		cancel()
		if err == nil || errors.Is(err, ErrNotHeld) {
			t.Fatalf("Refresh through a stall: got %v, want an error that is not ErrNotHeld", err)
		}
		if time.Now().Before(l.ValidUntil()) {
			t.Fatalf("ValidUntil %v is still ahead after a failed refresh outlived the lease", l.ValidUntil())
		}
		time.Sleep(ttl) // the lease has expired by the server's clock too
		next := mustAcquire(t, f.witness, "stall", time.Minute)
		f.p.Stall(false)
		time.Sleep(100 * time.Millisecond) // let the held refresh arrive
		wantErrIs(t, l.Refresh(testCtx(t), time.Minute), ErrNotHeld)
		wantErrIs(t, l.Release(testCtx(t)), ErrNotHeld)
		if got := inspect(t, f.witness, "stall"); !got.Held || got.Fence != next.Fence() || got.Holder != "witness" || got.TTL < 50*time.Second {
			t.Fatalf("got %+v, want the next holder's lease untouched", got)
		}
	})
}

// The network stalls during an acquire until the caller gives up. The
// caller holds nothing; whatever the held statement does when it arrives
// late, the name is free again within the lease, and fences still grow.
func TestFaults_stallDuringAcquire(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		const ttl = 300 * time.Millisecond
		if err := mustAcquire(t, f.c, "stall-acquire", ttl).Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		before := inspect(t, f.witness, "stall-acquire").Fence
		f.p.Stall(true)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		l, err := f.c.TryAcquire(ctx, "stall-acquire", ttl)
		cancel()
		if l != nil || !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquire through a stall: got %v, %v; want no lock, ErrNotAcquired and DeadlineExceeded", l, err)
		}
		f.p.Stall(false)
		// Within the lease of a late acquire the name is free again.
		deadline := time.Now().Add(10 * ttl)
		for {
			next, err := f.witness.TryAcquire(testCtx(t), "stall-acquire", time.Minute)
			if err == nil {
				if next.Fence() <= before {
					t.Fatalf("got fence %d, want above %d", next.Fence(), before)
				}
				break
			}
			wantErrIs(t, err, ErrNotAcquired)
			if time.Now().After(deadline) {
				t.Fatalf("name still held %v after the stall: %+v", 10*ttl, inspect(t, f.witness, "stall-acquire"))
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// KILL CONNECTION between operations: the next operation finds its
// connection gone and goes on, on a new one.
func TestFaults_killConnectionBetween(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		k := newKillEnv(t, e)
		ctx := testCtx(t)
		l := mustAcquire(t, k.c, "between", time.Minute)
		k.kill(t, k.connID(t))
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh after KILL CONNECTION: %v", err)
		}
		k.kill(t, k.connID(t))
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release after KILL CONNECTION: %v", err)
		}
		k.kill(t, k.connID(t))
		l2 := mustAcquire(t, k.c, "between", time.Minute)
		if l2.Fence() <= l.Fence() {
			t.Fatalf("got fence %d, want above %d", l2.Fence(), l.Fence())
		}
		if got := inspect(t, k.witness, "between"); !got.Held || got.Fence != l2.Fence() {
			t.Fatalf("got %+v, want held with fence %d", got, l2.Fence())
		}
	})
}

// KILL CONNECTION while each operation waits for the lease row's lock: the
// operation is retried on a new connection and gives the answer the killed
// attempt would have.
func TestFaults_killConnectionDuring(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		k := newKillEnv(t, e)
		table := k.c.table[1 : len(k.c.table)-1]
		ops := []struct {
			name string
			op   func(ctx context.Context, l *Lock) (*Lock, error)
		}{
			{"acquire", func(ctx context.Context, l *Lock) (*Lock, error) { return k.c.TryAcquire(ctx, "during", time.Minute) }},
			{"refresh", func(ctx context.Context, l *Lock) (*Lock, error) { return l, l.Refresh(ctx, 2*time.Minute) }},
			{"release", func(ctx context.Context, l *Lock) (*Lock, error) { return nil, l.Release(ctx) }},
		}
		// An expired lease for the acquire to take over, so that the row
		// exists for blockRow to lock.
		mustAcquire(t, k.witness, "during", time.Millisecond)
		time.Sleep(5 * time.Millisecond)
		var l *Lock
		for _, op := range ops {
			id := k.connID(t)
			commit := k.blockRow(t, table, "during")
			type result struct {
				l   *Lock
				err error
			}
			done := make(chan result, 1)
			go func() {
				l, err := op.op(testCtx(t), l)
				done <- result{l, err}
			}()
			k.waitRunning(t, id)
			k.kill(t, id)
			time.Sleep(50 * time.Millisecond) // the retry waits on the row too
			commit()
			r := <-done
			if r.err != nil {
				t.Fatalf("%s killed while it waited: %v", op.name, r.err)
			}
			l = r.l
			switch op.name {
			case "acquire", "refresh":
				if got := inspect(t, k.witness, "during"); !got.Held || got.Fence != l.Fence() || got.Holder != "faulty" {
					t.Fatalf("after %s: got %+v, want held by faulty with fence %d", op.name, got, l.Fence())
				}
			case "release":
				if got := inspect(t, k.witness, "during"); got.Held {
					t.Fatalf("after release: got %+v, want not held", got)
				}
			}
		}
	})
}

// The server restarts while a holder keeps its lease and a worker acquires
// and releases. Afterwards the library goes on without help: the held
// lease refreshes, every lock a caller believes held is held on the server,
// every release ends, and fences keep growing.
func TestFaults_serverRestart(t *testing.T) {
	cmd := os.Getenv(restartEnv)
	if cmd == "" {
		t.Skipf("set %s to a command that restarts the test server (as .ci/run does with scripts/testdb restart SERVER) to run this test", restartEnv)
	}
	soleServer(t, "restarts the server with "+restartEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.openDB(t), table, WithHolder("survivor"))
		witness := e.client(t, e.openDB(t), table, WithHolder("witness"))
		held := mustAcquire(t, c, "held", time.Minute)
		// An acquire cut by the restart whose clean-up failed too leaves a
		// lease nobody holds; it lasts workerTTL.
		const workerTTL = 10 * time.Second

		ctx, stop := context.WithCancel(testCtx(t))
		var (
			fences   []uint64
			workErrs []error
			wg       sync.WaitGroup
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := c.TryAcquire(ctx, "worker", workerTTL)
				if err != nil {
					time.Sleep(20 * time.Millisecond) // the server is away
					continue
				}
				fences = append(fences, l.Fence())
				for {
					err := l.Release(context.WithoutCancel(ctx))
					if err == nil {
						break
					}
					if errors.Is(err, ErrNotHeld) {
						workErrs = append(workErrs, err)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()

		time.Sleep(300 * time.Millisecond)
		before := startBeforeRestart(t, e.db)
		t.Logf("restarting the server with %s", cmd)
		restart := exec.Command("sh", "-c", cmd)
		if out, err := restart.CombinedOutput(); err != nil {
			stop()
			wg.Wait()
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		time.Sleep(300 * time.Millisecond)
		stop()
		wg.Wait()
		t.Logf("the worker acquired %d times", len(fences))
		wantRestarted(t, e.db, before)

		if err := held.Refresh(testCtx(t), time.Minute); err != nil {
			t.Fatalf("Refresh after the restart: %v", err)
		}
		if got := inspect(t, witness, "held"); !got.Held || got.Fence != held.Fence() {
			t.Fatalf("after the restart: got %+v, want held with fence %d", got, held.Fence())
		}
		if len(workErrs) > 0 {
			t.Fatalf("worker releases: %v", workErrs)
		}
		if len(fences) < 2 {
			t.Fatalf("the worker acquired %d times, want some before and after the restart", len(fences))
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fence %d after %d, want fences increasing", fences[i], fences[i-1])
			}
		}
		// Every release ended, so the name is free, or held at most for
		// workerTTL by an acquire whose outcome the restart hid.
		wctx, cancel := context.WithTimeout(testCtx(t), 3*workerTTL)
		defer cancel()
		next, err := witness.Acquire(wctx, "worker", time.Minute)
		if err != nil {
			t.Fatalf("witness Acquire after the restart: %v", err)
		}
		if next.Fence() <= fences[len(fences)-1] {
			t.Fatalf("fence after the restart %d, want above %d", next.Fence(), fences[len(fences)-1])
		}
		if err := held.Release(testCtx(t)); err != nil {
			t.Fatalf("Release after the restart: %v", err)
		}
	})
}
