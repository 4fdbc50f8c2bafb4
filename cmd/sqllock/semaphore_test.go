package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// The operator commands on a semaphore: inspect shows its slots (not "free,
// never taken"), list its held slots with the semaphore's fence, release
// --force --slot K takes one under a lock-delay (and --lock-delay=0 frees
// it), and release --force without --slot exits 64 saying to name one.
func TestOperatorCommands_semaphore(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if s.TiDB || s.Vitess {
			t.Skip("no semaphores on TiDB and Vitess")
		}
		e := newEnv(t, s.DSN)
		ctx := context.Background()
		c := e.client(sqllock.WithHolder("h"))
		sem := c.Semaphore("exports", 3)
		if _, err := sem.TryAcquire(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		l2, err := sem.TryAcquire(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		fence := strconv.FormatUint(l2.Fence(), 10)

		r := e.run("inspect", "exports")
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if r.status != 0 || len(lines) != 4 || lines[0] != "exports: a semaphore of 3 slots, 2 held, fence "+fence ||
			!strings.HasPrefix(lines[1], "  slot 1: held by h, ") || !strings.HasPrefix(lines[2], "  slot 2: held by h, ") || lines[3] != "  slot 3: free" {
			t.Errorf("inspect: got %d, %q, want the semaphore's 3 slots, 2 held, fence %s", r.status, r.stdout, fence)
		}
		var got inspected
		e.runJSON(&got, "inspect", "--json", "exports")
		if got.Name != "exports" || got.Held || got.Fence != 0 || len(got.Slots) != 3 ||
			got.Slots[1] != (lease{Name: "exports", Slot: 2, Holder: "h", Held: true, Fence: l2.Fence(), TTL: got.Slots[1].TTL}) || got.Slots[2].Held {
			t.Errorf("inspect --json: got %+v, want the lock never taken and the 3 slots", got)
		}

		r = e.run("list")
		if r.status != 0 || !strings.Contains(r.stdout, "exports (slot 1)  h       "+fence) || !strings.Contains(r.stdout, "exports (slot 2)  h       "+fence) {
			t.Errorf("list: got %q, want both slots with the semaphore's fence %s", r.stdout, fence)
		}
		var list []lease
		e.runJSON(&list, "list", "--json")
		if len(list) != 2 || list[0].Slot != 1 || list[1].Slot != 2 || list[0].Fence != l2.Fence() || list[1].Fence != l2.Fence() {
			t.Errorf("list --json: got %+v, want slots 1 and 2 with fence %s", list, fence)
		}

		// Without --slot the operator meant a slot: a usage error, so that a
		// script does not take the semaphore for released.
		for _, args := range [][]string{{"release", "--force", "exports"}, {"release", "--force", "--json", "exports"}} {
			r = e.run(args...)
			if want := "sqllock release exports: exports is a semaphore of 3 slots (2 held), with no lease of its own: name the slot to take with --slot K (sqllock inspect exports lists them)\n"; r.status != exitUsage || r.stderr != want || r.stdout != "" {
				t.Errorf("%s: got %d, stdout %q, stderr %q, want %d and %q", strings.Join(args, " "), r.status, r.stdout, r.stderr, exitUsage, want)
			}
		}
		r = e.run("release", "--force", "--slot", "2", "exports")
		if want := "exports slot 2: released the lease of h (fence " + fence + ", "; r.status != 0 || !strings.HasPrefix(r.stdout, want) ||
			!strings.Contains(r.stdout, " left); nobody can take it for ") || !strings.HasSuffix(r.stdout, "s (lock-delay; --lock-delay=0 to free it at once)\n") {
			t.Errorf("release --force --slot 2: got %d, %q, want %q... and the lock-delay", r.status, r.stdout, want)
		}
		if err := l2.Refresh(ctx, time.Minute); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Errorf("the evicted slot's refresh: got %v, want ErrNotHeld", err)
		}
		r = e.run("inspect", "exports")
		if want := "  slot 2: under a lock-delay after a forced release of h: nobody can take it for "; !strings.Contains(r.stdout, want) {
			t.Errorf("inspect under the lock-delay: got %q, want %q...", r.stdout, want)
		}
		var rel struct {
			Released bool   `json:"released"`
			Was      *lease `json:"was"`
		}
		e.runJSON(&rel, "release", "--force", "--json", "--slot=2", "--lock-delay=0", "exports")
		if !rel.Released || rel.Was == nil || rel.Was.Slot != 2 || rel.Was.Holder != "lock-delay after a forced release of h" || rel.Was.Fence != l2.Fence() {
			t.Errorf("release --force --json --slot=2 --lock-delay=0: got %+v, %+v, want slot 2's lock-delay", rel, rel.Was)
		}
		l, err := sem.TryAcquire(ctx, time.Minute)
		if err != nil || l.Slot() != 2 || l.Fence() <= l2.Fence() {
			t.Fatalf("after the slot was freed: got %v, %v, want slot 2 with a higher fence", l, err)
		}

		if r = e.run("release", "--force", "--slot", "3", "exports"); r.status != 0 || r.stdout != "exports slot 3: no lease to release\n" {
			t.Errorf("release --force --slot 3: got %d, %q, want no lease", r.status, r.stdout)
		}
		if r = e.run("release", "--force", "--slot", "65", "exports"); r.status != exitUsage || !strings.Contains(r.stderr, "--slot 65") {
			t.Errorf("release --force --slot 65: got %d, %q, want %d", r.status, r.stderr, exitUsage)
		}
		if r = e.run("inspect", "never"); r.stdout != "never: free, never taken\n" {
			t.Errorf("inspect of a name never taken: got %q", r.stdout)
		}
	})
}
