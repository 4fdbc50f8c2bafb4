package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock"
)

// run -n N: at most N copies of COMMAND run at once across hosts, each
// under one slot of the counting semaphore NAME (sqllock.Semaphore).

func (c *runConfig) registerSlots(fs *flag.FlagSet) {
	fs.IntVar(&c.slots, "n", 0, fmt.Sprintf("run at most `N` copies at once across hosts, each holding one of NAME's N slots (1..%d); NAME is then a semaphore, not a lock", sqllock.MaxSlots))
}

// doSlot runs fn under a slot of the semaphore, as run does under a lease,
// and keeps the slot's Lock for leaseInfo.
func (c *runConfig) doSlot(ctx context.Context, client *sqllock.Client, fn func(context.Context) error, opts []sqllock.DoOption) error {
	run := func(ctx context.Context, l *sqllock.Lock) error {
		c.slot = l
		return fn(ctx)
	}
	sem := client.Semaphore(c.name, c.slots)
	acquire := sem.TryAcquire
	if c.wait > 0 {
		acquire = sem.Acquire
	}
	l, err := acquire(ctx, c.ttl)
	if err == nil {
		err = l.Do(ctx, run, opts...)
	}
	if errors.Is(err, sqllock.ErrSlotCount) {
		// Another -n for NAME while a copy runs: a mistake to report as
		// run's own failure, not as the conflict status of a full semaphore.
		return errors.New(err.Error())
	}
	return err
}

// leaseInfo is what the command is told of the lease: the name's, or with
// -n the slot's.
func (c *runConfig) leaseInfo(ctx context.Context, client *sqllock.Client) (sqllock.Info, error) {
	if c.slot == nil {
		return client.Inspect(ctx, c.name)
	}
	infos, err := client.Semaphore(c.name, c.slots).Inspect(ctx)
	if err != nil {
		return sqllock.Info{}, err
	}
	for _, h := range infos {
		if h.Held && h.Slot == c.slot.Slot() {
			h.Fence = c.slot.Fence()
			return h, nil
		}
	}
	return sqllock.Info{}, fmt.Errorf("%w: slot %d of %s is no longer held", sqllock.ErrLockLost, c.slot.Slot(), c.name)
}

// slotEnv is what -n adds to the command's environment: the slot's number.
func (c *runConfig) slotEnv() []string {
	if c.slot == nil {
		return nil
	}
	return []string{"SQLLOCK_SLOT=" + strconv.Itoa(c.slot.Slot())}
}

// slotsHeld describes, for the message, the holders that kept every slot.
func (c *runConfig) slotsHeld(ctx context.Context, client *sqllock.Client, waited time.Duration) string {
	msg := fmt.Sprintf("all %d slots of %s are held", c.slots, c.name)
	if infos, err := client.Semaphore(c.name, c.slots).Inspect(ctx); err == nil {
		var held []string
		for _, h := range infos {
			if h.Held {
				held = append(held, fmt.Sprintf("%d by %s", h.Slot, h.Holder))
			}
		}
		if len(held) > 0 {
			msg += " (" + strings.Join(held, ", ") + ")"
		}
	}
	if c.wait > 0 {
		msg += fmt.Sprintf(" after waiting %v", waited.Round(time.Millisecond))
	}
	return msg
}

// listName is how list shows a lease's name: a semaphore's slot as the
// semaphore's name and the slot's number.
func listName(info sqllock.Info) string {
	if info.Slot > 0 {
		return fmt.Sprintf("%s (slot %d)", info.Name, info.Slot)
	}
	return info.Name
}

// leaseName names the lease run holds, for messages: NAME, or with -n its
// slot.
func (c *runConfig) leaseName() string {
	if c.slot == nil {
		return c.name
	}
	return fmt.Sprintf("%s slot %d", c.name, c.slot.Slot())
}
