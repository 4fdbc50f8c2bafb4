package engine

import (
	"context"
	"database/sql"
	"strconv"

	"github.com/sqllock/sqllock/internal/fault"
)

// The statements of counting semaphores, and the argument shapes of
// slot_acquire (queries.sql).

// SlotMark follows a semaphore's name in the names of its rows in the
// table; no lock name may end with it, or with it and two digits. It is in
// the rows' names alone, the statements' arguments: a lease's kind is never
// read from a name.
const SlotMark = "\x00slot"

// SlotRows is the fence row's name of semaphore name: P in queries.sql.
func SlotRows(name string) string { return name + SlotMark }

// SlotRowsEnd is Q in queries.sql: every name that starts with P sorts
// below it, byte for byte.
func SlotRowsEnd(name string) string {
	return name + SlotMark[:len(SlotMark)-1] + string(SlotMark[len(SlotMark)-1]+1)
}

// SlotName is the name of slot i (1-based) of semaphore name.
func SlotName(name string, i int) string {
	return SlotRows(name) + string([]byte{'0' + byte(i/10), '0' + byte(i%10)})
}

// Insert ids of slot_acquire below 2^32 (queries.sql); a slot taken gives
// the fence times 128 plus the slot.
const (
	SlotResized  = 1
	SlotMismatch = 1000
	SlotWiden    = 2000
	SlotTaken    = 1 << 32
)

// SlotAcquire returns slot_acquire with its slot row written v times, in
// the server's form: on MariaDB with the bound on its lock wait
// (queries.sql, lock_wait_mariadb).
func (s *Server) SlotAcquire(v int) string {
	f := s.Forms()
	return f.q.Slot(f.Table, f.LockWait, v)
}

// SlotArgs returns slot_acquire's arguments for a visit of v slot rows of
// semaphore sem of n slots, under token for us µs.
func SlotArgs(sem string, n, v int, token string, holder any, us int64) []any {
	mode := 128
	if v != n {
		mode = 256
	}
	p, nArg, tok, usArg := any(SlotRows(sem)), any(strconv.Itoa(n)), any(token), any(us)
	args := make([]any, 0, 16+8*v)
	args = append(args, mode, p, nArg)
	for i := 1; i <= v; i++ {
		args = append(args, i, SlotName(sem, i), i, tok, i, holder, i, usArg)
	}
	args = append(args, p)
	return append(args, tok, nArg, mode, v, tok, holder, usArg, tok, nArg)
}

// ProveSlots proves the semaphore statements, once per Client, before
// its first slot is taken: slot_acquire takes the one slot of a new
// semaphore, and refuses it to another token; slot_release deletes the
// slot for its owner only. slot_acquire is prepared, as the Client
// prepares it (on MariaDB: with its lock wait bound).
func (s *Server) ProveSlots(ctx context.Context) error {
	rows := func(sem string) []string { return []string{SlotRows(sem), SlotName(sem, 1)} }
	return s.proveLater(ctx, LaterSlots, rows, func(p *prover, name, a, b string) error {
		sem := name
		take := func(step, token string) (uint64, error) { return s.proofTakeSlot(p, sem, step, token) }
		id, err := take("take the slot of a new semaphore of one", a)
		if err != nil {
			return err
		}
		if id < SlotTaken || id%128 != 1 {
			return p.unsupported("slot_acquire", "taking the free slot of a semaphore of one reported %d, not its fence times 128 plus slot 1", id)
		}
		if id, err := take("take the slot another owner holds", b); err != nil {
			return err
		} else if id != 0 {
			return p.unsupported("slot_acquire", "taking a slot of a full semaphore reported %d instead of 0 (all held)", id)
		}
		for _, step := range []struct {
			token string
			want  int64
			by    string
		}{{b, 0, "under another token"}, {a, 1, "by the owner"}} {
			var res sql.Result
			err := fault.RetryRolledBack(p.ctx, func() (err error) {
				res, err = p.conn.ExecContext(p.ctx, s.Text().Substitute(s.cfg.Queries["slot_release"]), SlotRows(sem), SlotRowsEnd(sem), step.token)
				return err
			})
			if err != nil {
				return p.failed("slot_release", "delete the slot "+step.by, err)
			}
			if n, err := p.rows("slot_release", "delete the slot "+step.by, res); err != nil {
				return err
			} else if n != step.want {
				return p.unsupported("slot_release", "deleting a semaphore's slots %s removed %d rows instead of %d", step.by, n, step.want)
			}
		}
		return nil
	})
}

// proofTakeSlot sends slot_acquire, as step of a proof, for token's slot
// of the semaphore of one sem, and again when the first send recorded the
// slot count; it returns the insert id.
func (s *Server) proofTakeSlot(p *prover, sem, step, token string) (uint64, error) {
	text, args := s.SlotAcquire(1), SlotArgs(sem, 1, 1, token, s.cfg.Holder, proofTTL.Microseconds())
	id, err := p.id("slot_acquire", step, text, args...)
	if err == nil && id == SlotResized {
		id, err = p.id("slot_acquire", step+", after recording the slot count", text, args...)
	}
	return id, err
}
