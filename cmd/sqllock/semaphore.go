package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/sqllock/sqllock"
)

// The operator commands on a semaphore's slots: inspect shows them, list
// shows those held (each as NAME (slot K), with the semaphore's fence), and
// release --force --slot K takes one.

// slotSuffix is how many bytes a semaphore's slots add to its name in
// their rows' names (0x00 'slot' and two digits): a longer name is no
// semaphore's.
const slotSuffix = 7

// semaphoreSlots returns the slots of the semaphore name, one Info each;
// none when there is no such semaphore, or none can be: a name too long for
// its slots' rows, a server without semaphores (TiDB, Vitess).
func semaphoreSlots(ctx context.Context, c *sqllock.Client, name string) ([]sqllock.Info, error) {
	if len(name) > sqllock.MaxNameLen-slotSuffix {
		return nil, nil
	}
	slots, err := c.Semaphore(name, 1).Inspect(ctx)
	if errors.Is(err, sqllock.ErrUnsupportedServer) {
		return nil, nil
	}
	return slots, err
}

func heldCount(slots []sqllock.Info) int {
	n := 0
	for _, s := range slots {
		if s.Held {
			n++
		}
	}
	return n
}

// printSlots writes inspect's text about the semaphore name's slots: a
// line for the semaphore, then one per slot.
func printSlots(w io.Writer, name string, slots []sqllock.Info) {
	if len(slots) == 0 {
		return
	}
	fmt.Fprintf(w, "%s: a semaphore of %d slots, %d held, fence %d\n", name, len(slots), heldCount(slots), slots[0].Fence)
	for _, s := range slots {
		fmt.Fprintf(w, "  slot %d: %s\n", s.Slot, slotText(s))
	}
}

// slotText says what inspect found on a slot; the fence is the semaphore's.
func slotText(s sqllock.Info) string {
	switch {
	case s.Held && isLockDelay(s):
		return fmt.Sprintf("under a %s: nobody can take it for %v", s.Holder, roundTTL(s.TTL))
	case s.Held:
		return fmt.Sprintf("held by %s, %v left", s.Holder, roundTTL(s.TTL))
	}
	return "free"
}
