package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"
)

// SlotsInfo describes a counting semaphore as the server sees it.
type SlotsInfo struct {
	Name string
	// N is the number of slots the semaphore has; 0 when it was never
	// taken.
	N int
	// Fence is the last fencing token issued for any of its slots.
	Fence uint64
	// Held lists the slots held now, in slot order, each with its Slot,
	// Holder and TTL (Fence is the semaphore's).
	Held []Info
}

// InspectSlots reads the semaphore name in one statement: its number of
// slots, its fence and the slots held now. A semaphore never taken comes back
// with N 0 and no error. ([Client.Inspect] reads a lock: a semaphore and a
// lock of the same name are two things.)
func (c *Client) InspectSlots(ctx context.Context, name string) (SlotsInfo, error) {
	if err := checkSlotArgs(name, 1, MinTTL); err != nil {
		return SlotsInfo{}, err
	}
	op := fmt.Sprintf("inspect the slots of %q", name)
	if _, err := c.slotsServer(ctx); err != nil {
		return SlotsInfo{}, c.serverError(op, err)
	}
	p := slotRows(name)
	rows, err := c.db.QueryContext(ctx, c.substitute(queries["slot_list"]), p, slotRowsEnd(name))
	if err != nil {
		return SlotsInfo{}, c.serverError(op, err)
	}
	defer rows.Close()
	info := SlotsInfo{Name: name}
	for rows.Next() {
		var (
			rowName, kind, text string
			fence               uint64
			held                bool
			us                  sql.NullInt64
		)
		if err := rows.Scan(&rowName, &kind, &text, &fence, &held, &us); err != nil {
			return SlotsInfo{}, c.serverError(op, err)
		}
		sem, slot := splitSlotName(rowName)
		switch {
		case kind == "F" && rowName == p:
			info.N, _ = strconv.Atoi(text)
			info.Fence = fence
		case kind == "L" && sem == name && slot > 0 && held:
			info.Held = append(info.Held, Info{Name: name, Slot: slot, Holder: text, Held: true,
				TTL: time.Duration(us.Int64) * time.Microsecond})
		}
	}
	if err := rows.Err(); err != nil {
		return SlotsInfo{}, c.serverError(op, err)
	}
	for i := range info.Held {
		info.Held[i].Fence = info.Fence
	}
	return info, nil
}
