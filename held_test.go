package sqllock

import (
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
