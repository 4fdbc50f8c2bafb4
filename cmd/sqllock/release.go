package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/sqllock/sqllock"
)

// release --force: sqllock.Client.ForceRelease, which leaves a live lease
// under a lock-delay, so that the evicted holder's work stops before anyone
// else's starts; --lock-delay sets it (sqllock.WithLockDelay).

// lockDelayFlag is --lock-delay. Unset, the library's default; its zero
// value prints no default in the help.
type lockDelayFlag struct {
	d   time.Duration
	set bool
}

func (f *lockDelayFlag) register(fs *flag.FlagSet) {
	fs.Var(f, "lock-delay", "keep a live lease's name taken from everyone for `DURATION` after taking it (0: free it at once); "+
		"default: until the evicted holder's next renewal has seen the loss and its work has stopped")
}

func (f *lockDelayFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.d.String()
}

func (f *lockDelayFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration (such as 0, 5s or 1m)")
	}
	if d < 0 {
		return errors.New("must be 0 or more")
	}
	f.d, f.set = d, true
	return nil
}

// options are the Client's options the flag asks for.
func (f *lockDelayFlag) options() []sqllock.Option {
	if !f.set {
		return nil
	}
	return []sqllock.Option{sqllock.WithLockDelay(f.d)}
}

// lockDelayHolder begins the holder of a lock-delay: the library says so
// in its holder, which ends with the evicted holder's.
const lockDelayHolder = "lock-delay after a forced release of "

// isLockDelay reports whether info is a lock-delay a forced release left.
func isLockDelay(info sqllock.Info) bool {
	return strings.HasPrefix(info.Holder, lockDelayHolder)
}

// evictedText says, for run's message, how a forced release took the lease
// ours (what leaseInfo read when the command started) from us, or returns
// "" when the row does not show one: a lock-delay on our lease (same
// holder and, for a name, same fence) or, for a name, our lease deleted
// with the fence unchanged, which only a forced release does while we hold
// it. It reads the table within timeout.
func (c *runConfig) evictedText(client *sqllock.Client, ours sqllock.Info) string {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var now sqllock.Info
	if c.slot == nil {
		info, err := client.Inspect(ctx, c.name)
		if err != nil || info.Fence != ours.Fence {
			return ""
		}
		now = info
	} else {
		// A slot's fence is its semaphore's, which later acquires of other
		// slots raise; a slot deleted leaves no row to tell.
		infos, err := client.Semaphore(c.name, c.slots).Inspect(ctx)
		if err != nil || len(infos) < ours.Slot {
			return ""
		}
		now = infos[ours.Slot-1]
	}
	what := fmt.Sprintf("was taken by a forced release (sqllock release --force) while %s ran; killed it", quoteArgs(c.argv))
	switch {
	case now.Holder == lockDelayHolder+ours.Holder && now.Held:
		return fmt.Sprintf("%s; the lock-delay keeps %s from everyone for %v more", what, c.leaseName(), roundTTL(now.TTL))
	case now.Holder == lockDelayHolder+ours.Holder:
		return fmt.Sprintf("%s; its lock-delay has ended: %s is free", what, c.leaseName())
	case c.slot == nil && now.Holder == "":
		return fmt.Sprintf("%s; with no lock-delay (--lock-delay=0): %s is free", what, c.leaseName())
	}
	return ""
}

// releaseCmd takes the lease on name, or with slot above 0 that slot of
// the semaphore name.
func releaseCmd(ctx context.Context, c *sqllock.Client, name string, slot int, out *printer) error {
	var (
		info sqllock.Info
		err  error
	)
	if slot > 0 {
		info, err = c.Semaphore(name, sqllock.MaxSlots).ForceRelease(ctx, slot)
	} else {
		info, err = c.ForceRelease(ctx, name)
	}
	released := err == nil
	if errors.Is(err, sqllock.ErrNotHeld) {
		err = nil
	}
	if err != nil {
		return err
	}
	if !released && slot == 0 {
		// A semaphore's slots are no lease on its name: the operator meant
		// one of them, and a script must not take "no lease" for done.
		slots, err := semaphoreSlots(ctx, c, name)
		if err != nil {
			return err
		}
		if len(slots) > 0 {
			return usageError(fmt.Sprintf("%s is a semaphore of %d slots (%d held), with no lease of its own: name the slot to take with --slot K (sqllock inspect %s lists them)",
				name, len(slots), heldCount(slots), name))
		}
	}
	if out.json {
		out.printJSON(struct {
			Released bool   `json:"released"`
			Was      *lease `json:"was,omitempty"`
			// LockDelay is how long nobody can take the name, in seconds.
			LockDelay float64 `json:"lock_delay_seconds"`
		}{released, leaseOrNil(released, info), info.LockDelay.Seconds()})
		return nil
	}
	what := name
	if slot > 0 {
		what = fmt.Sprintf("%s slot %d", name, slot)
	}
	fmt.Fprintf(out.w, "%s: %s\n", what, releasedText(released, info))
	return nil
}

// usageError is a command's mistake found only at the server, such as
// release --force without --slot on a semaphore: the command exits 64.
type usageError string

func (e usageError) Error() string { return string(e) }

// releasedText says what release --force did.
func releasedText(released bool, info sqllock.Info) string {
	delay := fmt.Sprintf("nobody can take it for %v (lock-delay; --lock-delay=0 to free it at once)", roundTTL(info.LockDelay))
	switch {
	case !released:
		return "no lease to release"
	case !info.Held:
		return fmt.Sprintf("released the expired lease of %s (fence %d); free now", info.Holder, info.Fence)
	case isLockDelay(info) && info.LockDelay > 0:
		return fmt.Sprintf("under a %s (fence %d): %s", info.Holder, info.Fence, delay)
	case isLockDelay(info):
		return fmt.Sprintf("released the %s (fence %d); free now", info.Holder, info.Fence)
	case info.LockDelay > 0:
		return fmt.Sprintf("released the lease of %s (fence %d, %v left); %s", info.Holder, info.Fence, roundTTL(info.TTL), delay)
	}
	return fmt.Sprintf("released the lease of %s (fence %d, %v left); free now, and its holder learns of it at its next renewal",
		info.Holder, info.Fence, roundTTL(info.TTL))
}

func leaseOrNil(ok bool, info sqllock.Info) *lease {
	if !ok {
		return nil
	}
	l := leaseOf(info)
	return &l
}
