package engine

import (
	"context"
	"strconv"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// sessionChars is how many characters of a token name its session
// (queries.sql, the top: LEFT(owner, 16)).
const sessionChars = 16

// ProveSessions proves the session statements, once per Client, before it
// opens its first session (Sessions): what a session keeps alive rests on
// each of them answering as queries.sql says, on this server, and a lease
// renewed by a session that is not would be held by two. On the proof name,
// whose token a begins with the name of a session of the proof's own, and
// on the one slot of a semaphore of that name, taken by a: session_open
// writes the session; session_attach attaches the two leases of a; another
// owner's acquire finds the name's attached (3), and acquire_attached and
// slot_acquire refuse each, the session being live; session_renew reports
// the session live with no change by others (1), and a session that has no
// row ended (0); session_found finds the leases attached; session_detach
// detaches them, and session_found no longer finds them; session_close
// deletes the session. Slots are proven here only where the Client keeps
// sessions, which are the servers whose semaphores ProveSlots proves.
func (s *Server) ProveSessions(ctx context.Context) error {
	session := func(name string) string { return name[len(ProofPrefix):][:sessionChars] }
	rows := func(name string) []string { return []string{name, session(name), SlotRows(name), SlotName(name, 1)} }
	return s.proveLater(ctx, LaterSessions, rows, func(p *prover, name, a, b string) error {
		f := s.Forms()
		sess, other := sqltext.Hex(session(name)), sqltext.Hex(b[:sessionChars])
		us := strconv.FormatInt(proofTTL.Microseconds(), 10)
		lits := []RenewLit{NewRenewLit(name, a), NewRenewLit(SlotName(name, 1), a)}
		names, pairs := renewLists(lits)
		if id, err := p.id("acquire", "take a free name", f.SQL[Acquire], s.acquireArgs(name, a, proofTTL.Microseconds())...); err != nil {
			return err
		} else if id == 0 || id == 3 {
			return p.unsupported("acquire", "an acquire of a free name reported %d", id)
		}
		takeSlot := func(step, token string) (uint64, error) { return s.proofTakeSlot(p, name, step, token) }
		if id, err := takeSlot("take the slot of a new semaphore of one", a); err != nil {
			return err
		} else if id < SlotTaken {
			return p.unsupported("slot_acquire", "taking the free slot of a semaphore of one reported %d", id)
		}
		if _, err := p.execText("session_open", "open a session", s.SessionText("session_open", sess, sess, sqltext.Hex(s.cfg.Holder), us)); err != nil {
			return err
		}
		if err := p.wantRows("session_attach", "attach the leases", s.renewText("session_attach", sess, sess, names, pairs), 2); err != nil {
			return err
		}
		if id, err := p.id("acquire", "take an attached lease", f.SQL[Acquire], s.acquireArgs(name, b, proofTTL.Microseconds())...); err != nil {
			return err
		} else if id != 3 {
			return p.unsupported("acquire", "an acquire of an attached lease reported %d, not 3", id)
		}
		if id, err := p.id("acquire_attached", "take a lease attached to a live session", f.SQL[AcquireAttached], s.acquireArgs(name, b, proofTTL.Microseconds())...); err != nil {
			return err
		} else if id != 0 {
			return p.unsupported("acquire_attached", "an acquire of a lease attached to a live session reported %d, not 0 (held)", id)
		}
		if id, err := takeSlot("take a slot attached to a live session", b); err != nil {
			return err
		} else if id != 0 {
			return p.unsupported("slot_acquire", "taking a slot attached to a live session reported %d, not 0 (all held)", id)
		}
		for _, step := range []struct {
			sess, what string
			want       int64
		}{{sess, "renew the session", 1}, {other, "renew a session that has no row", 0}} {
			res, err := p.execText("session_renew", step.what, s.SessionText("session_renew", us, step.sess, step.sess))
			if err != nil {
				return err
			}
			if id, err := res.LastInsertId(); err != nil {
				return p.failed("session_renew", step.what, err)
			} else if id != step.want {
				return p.unsupported("session_renew", "%s reported %d, not %d", step.what, id, step.want)
			}
		}
		found := s.renewText("session_found", names, pairs)
		if err := p.wantFound(found, "the attached leases", 2); err != nil {
			return err
		}
		if err := p.wantRows("session_detach", "detach the leases", s.renewText("session_detach", names, pairs), 2); err != nil {
			return err
		}
		if err := p.wantFound(found, "the leases detached", 0); err != nil {
			return err
		}
		return p.wantRows("session_close", "close the session", s.SessionText("session_close", sess, sess, "1"), 1)
	})
}

// wantRows sends text, statement stmt, as step, and fails unless it
// changed want rows.
func (p *prover) wantRows(stmt, step, text string, want int64) error {
	res, err := p.execText(stmt, step, text)
	if err != nil {
		return err
	}
	if n, err := p.rows(stmt, step, res); err != nil {
		return err
	} else if n != want {
		return p.unsupported(stmt, "%s changed %d rows, not %d", step, n, want)
	}
	return nil
}

// wantFound runs session_found's query q on the proof's connection and
// fails unless it finds want rows, of what.
func (p *prover) wantFound(q, what string, want int) error {
	n := 0
	err := fault.RetryRolledBack(p.ctx, func() error {
		n = 0
		rs, err := p.conn.QueryContext(p.ctx, q)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			n++
		}
		return rs.Err()
	})
	if err != nil {
		return p.failed("session_found", "find "+what, err)
	}
	if n != want {
		return p.unsupported("session_found", "found %d rows of %s, not %d", n, what, want)
	}
	return nil
}
