package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"
)

// Inspect reads the semaphore in one statement and returns one Info per
// slot, 1 to the number of slots the server records for it (which may
// differ from the Semaphore's n until an acquire resizes it), each with the
// semaphore's name, its Slot, whether it is Held, its Holder and TTL, and
// the semaphore's Fence (shared by its slots). A semaphore never taken
// comes back empty, with no error.
func (s *Semaphore) Inspect(ctx context.Context) ([]Info, error) {
	c, name := s.c, s.name
	if err := checkSlotArgs(name, 1, MinTTL); err != nil {
		return nil, err
	}
	op := fmt.Sprintf("inspect the semaphore %q", name)
	if _, err := c.slotsForms(ctx, qInspect); err != nil {
		return nil, c.serverError(op, err)
	}
	p := slotRows(name)
	rows, err := c.db.QueryContext(ctx, c.eng.Text().Substitute(queries["slot_list"]), p, slotRowsEnd(name))
	if err != nil {
		return nil, c.serverError(op, err)
	}
	defer rows.Close()
	var (
		n     int
		fence uint64
		held  []Info
	)
	for rows.Next() {
		var (
			rowName, kind, text string
			f                   uint64
			live                bool
			us                  sql.NullInt64
		)
		if err := rows.Scan(&rowName, &kind, &text, &f, &live, &us); err != nil {
			return nil, c.serverError(op, err)
		}
		sem, slot := slotOfRow(rowName)
		switch {
		case kind == "F" && rowName == p:
			n, _ = strconv.Atoi(text)
			fence = f
		case kind == "L" && sem == name && slot > 0 && live:
			held = append(held, Info{Slot: slot, Holder: text, Held: true,
				TTL: time.Duration(us.Int64) * time.Microsecond})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, c.serverError(op, err)
	}
	if n == 0 {
		return nil, nil
	}
	infos := make([]Info, n)
	for i := range infos {
		infos[i] = Info{Slot: i + 1}
	}
	for _, h := range held {
		if h.Slot <= n {
			infos[h.Slot-1] = h
		}
	}
	for i := range infos {
		infos[i].Name, infos[i].Fence = name, fence
	}
	return infos, nil
}

// ForceRelease takes slot (1 to [MaxSlots]) of the semaphore from whoever
// holds it, as [Client.ForceRelease] takes a name, and returns what it was.
func (s *Semaphore) ForceRelease(ctx context.Context, slot int) (Info, error) {
	if err := checkSlotArgs(s.name, 1, MinTTL); err != nil {
		return Info{}, err
	}
	if slot < 1 || slot > MaxSlots {
		return Info{}, fmt.Errorf("sqllock: slot %d: a semaphore's slots are 1 to at most %d (MaxSlots)", slot, MaxSlots)
	}
	info, err := s.c.forceRelease(ctx, slotName(s.name, slot), slotRows(s.name), fmt.Sprintf("slot %d of the semaphore %q", slot, s.name))
	if err != nil {
		return Info{}, err
	}
	info.Name, info.Slot = s.name, slot
	return info, nil
}
