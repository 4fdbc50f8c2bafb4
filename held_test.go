package sqllock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// Held lists this Client's live leases; List every live lease in the table.
func TestClient_Held_List(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held: got %v, want none", got)
		}
		lb := mustAcquire(t, a, "b", time.Minute)
		la := mustAcquire(t, a, "a", time.Minute)
		mustAcquire(t, a, "lapsed", 20*time.Millisecond)
		lc := mustAcquire(t, b, "c", time.Minute)
		released := mustAcquire(t, b, "released", time.Minute)
		if err := released.Release(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		if got, want := a.Held(), []string{"a", "b"}; !slices.Equal(got, want) {
			t.Fatalf("Held: got %v, want %v", got, want)
		}
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := a.Held(), []string{"b"}; !slices.Equal(got, want) {
			t.Fatalf("Held after a release: got %v, want %v", got, want)
		}

		infos, err := b.List(ctx)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		want := []Info{{Name: "b", Holder: "a", Fence: lb.Fence(), Held: true}, {Name: "c", Holder: "b", Fence: lc.Fence(), Held: true}}
		if len(infos) != len(want) {
			t.Fatalf("List: got %+v, want %+v", infos, want)
		}
		for i, got := range infos {
			if got.TTL <= 50*time.Second || got.TTL > time.Minute {
				t.Fatalf("List[%d].TTL: got %v, want just under a minute", i, got.TTL)
			}
			if got.Age < 0 || got.Age > 10*time.Second {
				t.Fatalf("List[%d].Age: got %v, want the time since its acquire", i, got.Age)
			}
			got.TTL, got.Age = 0, 0
			if got != want[i] {
				t.Fatalf("List[%d]: got %+v, want %+v", i, got, want[i])
			}
		}
	})
}

// An acquire cut by its context while it waits for a lock on the lease row's
// place goes on waiting on the server, and commits once the lock is free:
// after its cleanup DELETE, which found no row and did not wait, has
// returned. That leaves a live lease under a token nobody holds; the
// Client's next acquire of the name claims it, so the name is not blocked
// for the lease's ttl.
func TestClient_TryAcquire_cutWhileWaiting_nameNotBlocked(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		k := newKillEnv(t, e)
		table := k.c.table[1 : len(k.c.table)-1]
		const before = 0 // the name was never taken
		// A locking read of the missing lease row locks the gap it would go
		// in (REPEATABLE READ, both servers' default): the acquire's insert
		// waits, the cleanup's DELETE of no row does not.
		// The Client's statements prepared, so that the acquire is the one
		// statement its connection runs.
		if err := mustAcquire(t, k.c, "warm", time.Minute).Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		commit := k.blockRow(t, table, "cut")
		id := k.connID(t)
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := k.c.TryAcquire(ctx, "cut", time.Hour)
			done <- err
		}()
		k.waitRunning(t, id)
		cancel()
		if err := <-done; !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("TryAcquire cut while it waited: got %v, want ErrNotAcquired and Canceled", err)
		}
		commit()

		// The cut statement commits on the server: the name is held under
		// the cut acquire's token, for an hour.
		waitFor(t, 10*time.Second, "the cut acquire to commit", func() bool {
			return inspect(t, k.witness, "cut").Fence > before
		})
		if got := inspect(t, k.witness, "cut"); !got.Held || got.Holder != "faulty" {
			t.Fatalf("after the cut acquire committed: got %+v, want held by faulty", got)
		}
		_, err := k.witness.TryAcquire(testCtx(t), "cut", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)

		l, err := k.c.TryAcquire(testCtx(t), "cut", time.Minute)
		if err != nil {
			t.Fatalf("the Client's next TryAcquire: got %v, want the lease its cut acquire left", err)
		}
		if got := inspect(t, k.witness, "cut"); !got.Held || got.Fence != l.Fence() {
			t.Fatalf("after the claim: got %+v, want held with fence %d", got, l.Fence())
		}
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
		mustAcquire(t, k.witness, "cut", time.Minute)
	})
}

// An acquire whose reply is lost, and whose retries and cleanup cannot reach
// the server either, leaves a lease under a token nobody holds; the server
// then restarts. The lease survives the restart, and the Client's next
// acquire of the name claims it instead of waiting out its ttl.
func TestClient_TryAcquire_unknownOutcome_claimedAcrossRestart(t *testing.T) {
	cmd := os.Getenv(restartEnv)
	if cmd == "" {
		t.Skipf("set %s to a command that restarts the test server to run this test", restartEnv)
	}
	soleServer(t, "restarts the server with "+restartEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		loseAcquire(t, f, "job")

		before := startBeforeRestart(t, e.db)
		t.Logf("restarting the server with %s", cmd)
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		wantRestarted(t, e.db, before)
		// Still unreachable from the Client: the claim fails and is kept.
		if _, err := f.c.TryAcquire(ctx, "job", time.Minute); err == nil {
			t.Fatalf("TryAcquire while unreachable: got nil, want an error")
		}
		f.p.Refuse(false)

		_, err := f.witness.TryAcquire(ctx, "job", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		l, err := f.c.TryAcquire(ctx, "job", time.Minute)
		if err != nil {
			t.Fatalf("the Client's next TryAcquire after the restart: got %v, want the lease its lost acquire left", err)
		}
		if got := inspect(t, f.witness, "job"); !got.Held || got.Fence != l.Fence() {
			t.Fatalf("after the claim: got %+v, want held with fence %d", got, l.Fence())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		f.wantFree(t, "job", l.Fence())
	})
}

// Close deletes the lease an acquire with an unknown outcome may have left,
// as it releases the leases it holds.
func TestClient_Close_releasesUnknownAcquire(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		loseAcquire(t, f, "job")
		f.p.Refuse(false)
		if err := f.c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if got := inspect(t, f.witness, "job"); got.Held {
			t.Fatalf("after Close: got %+v, want the name free", got)
		}
	})
}

// loseAcquire makes an acquire of name through f's proxy run on the server
// while its reply, its retries and its cleanup are lost: the proxy cuts the
// connection after the statement and refuses new ones until the caller says
// otherwise. It checks that the lease was left, for an hour, under the
// lost acquire's token.
func loseAcquire(t *testing.T, f *faultEnv, name string) {
	t.Helper()
	ctx := testCtx(t)
	// The first use before the cut, and at most one idle connection
	// (the first use's proof holds several at once), so that the acquire
	// takes the only one, or a new one, and its resends and cleanup need
	// another. The proxy refuses new connections from the cut on, not
	// before: refusing in advance left the acquire no connection at all
	// when the pool had dropped its idle one, and under load the acquire
	// then never ran.
	f.c.db.SetMaxIdleConns(1)
	warm := mustAcquire(t, f.c, name, time.Minute)
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	const rounds = 5
	for round := 1; ; round++ {
		before := inspect(t, f.witness, name).Fence
		f.p.CutAfterCommandThenRefuse(proxyComStmtExecute, 1)
		replied := f.p.CutReplied()
		_, err := f.c.TryAcquire(ctx, name, time.Hour)
		if err == nil || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("TryAcquire cut with no way back: got %v, want a connection error", err)
		}
		t.Logf("the cut acquire: %v", err)
		// The client gave up; the server may still be running the
		// statement (a loaded machine): read what it wrote only once it
		// has answered.
		select {
		case <-replied:
		case <-ctx.Done():
			t.Fatalf("the server never answered the cut acquire (the proxy saw %v)", f.p.Commands())
		}
		got := inspect(t, f.witness, name)
		if f.vitess && !got.Held {
			t.Skip(vitessCancelsCut)
		}
		if !got.Held && got.Fence == before && round < rounds {
			// The server answered and wrote nothing: the statement failed
			// there (on a loaded machine, the session guard's clock check
			// or a lock's timeout), and the proxy dropped its error with
			// the reply. No lease was left to lose. The Client remembers
			// the token as unsettled, and its next acquire would first
			// send that token's DELETE, which the cut would then fall on:
			// forget it (it can hold nothing, now or later), and cut
			// another acquire.
			t.Logf("round %d: the server did not commit the cut acquire; cutting another", round)
			f.p.Refuse(false)
			f.c.orphans.Take(name, time.Now())
			continue
		}
		if !got.Held || got.Fence <= before || got.Holder != "faulty" {
			t.Fatalf("after the cut acquire (round %d): got %+v, want held by faulty with a fence above %d", round, got, before)
		}
		return
	}
}

// Issue 20, point 6. Whether a DELETE by an orphaned token settles it is
// judged by when the DELETE was sent: one sent before the acquire could
// still commit, whose reply comes after, proves nothing when it finds no
// row.
func TestClient_deleteOrphan_settledBySendTime(t *testing.T) {
	e := newMockEnv(t)
	tok := &tokenArg{}
	e.expectExec("release", releaseArgs("job", tok), reply{id: 0, rows: 0, delay: 100 * time.Millisecond})
	token, _ := newToken()
	x := orphan{Value: token, Settled: time.Now().Add(50 * time.Millisecond)}
	if e.c.deleteOrphan(t.Context(), &e.c.orphans, "job", x) {
		t.Error("a DELETE sent before the acquire could commit, finding no row: got settled, want not")
	}
	e.done()
}
