package engine

import (
	"context"
	"database/sql"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// ProveSets proves the set statements, once per Client, before its
// first set is taken: acquire (taken; refused with 1690 while another owner
// holds a name), refresh, check and release (each for the owner and for
// another token), release with a minimum hold, and refresh once the leases
// are gone (refused with 1690), each as text, as sets send them.
func (s *Server) ProveSets(ctx context.Context) error {
	setNames := func(name string) []string { return []string{name + " 1", name + " 2"} }
	return s.proveLater(ctx, LaterSets, setNames, func(p *prover, name, a, b string) error {
		names := setNames(name)
		mine, other := NewSet(names, a), NewSet(names, b)
		res, err := p.execText("all_acquire", "take two free names", s.SetAcquire(mine, proofTTL))
		if err != nil {
			return err
		}
		if s.Forms().OneRow {
			if err := p.proveSetFences(mine); err != nil {
				return err
			}
		} else if id, err := res.LastInsertId(); err != nil {
			return p.failed("all_acquire", "take two free names", err)
		} else if id&1 == 0 || id < 4 {
			return p.unsupported("all_acquire", "an acquire of a set of free names reported %d, not twice its fence plus one", uint64(id))
		}
		if err := fault.RetryRolledBack(p.ctx, func() error {
			_, err := p.conn.ExecContext(p.ctx, s.SetAcquire(other, proofTTL))
			return err
		}); err == nil {
			return p.unsupported("all_acquire", "an acquire of a set whose names another owner held succeeded: "+
				"the BIGINT UNSIGNED overflow it relies on to refuse them raised no error (1690)")
		} else if n, ok := fault.Errno(err); !ok || n != fault.OutOfRange {
			return p.failed("all_acquire", "take a set another owner holds, which must fail with 1690", err)
		}
		each := func(what string, minHold time.Duration) error {
			for _, step := range []struct {
				set  *Set
				want int64
				by   string
			}{{other, 0, "under another token"}, {mine, 2, "by the owner"}} {
				text, stmt := s.SetRelease(step.set, minHold)
				res, err := p.execText(stmt, what+" "+step.by, text)
				if err != nil {
					return err
				}
				if n, err := p.rows(stmt, what+" "+step.by, res); err != nil {
					return err
				} else if n != step.want {
					return p.unsupported(stmt, "a %s of a set of two live leases %s changed %d rows instead of %d", what, step.by, n, step.want)
				}
			}
			return nil
		}
		// A set's refresh is all or nothing: under another token it must
		// fail with 1690, as all_acquire does, and extend nothing.
		if err := p.refreshRefused(s.SetRefresh(other, proofTTL), "a set whose leases another owner holds",
			"the BIGINT UNSIGNED overflow it relies on to refuse it"); err != nil {
			return err
		}
		if res, err := p.execText("all_refresh", "refresh by the owner", s.SetRefresh(mine, proofTTL)); err != nil {
			return err
		} else if n, err := p.rows("all_refresh", "refresh by the owner", res); err != nil {
			return err
		} else if n != 2 {
			return p.unsupported("all_refresh", "a refresh of a set of two live leases by the owner changed %d rows instead of 2", n)
		}
		if err := p.inTx("all_check", func(tx *sql.Tx) error {
			for _, step := range []struct {
				set  *Set
				want int64
				by   string
			}{{other, 0, "under another token"}, {mine, 2, "by the owner"}} {
				res, err := tx.ExecContext(p.ctx, s.SetCheck(step.set))
				if err != nil {
					return p.failed("all_check", "check "+step.by, err)
				}
				if n, err := p.rows("all_check", "check "+step.by, res); err != nil {
					return err
				} else if n != step.want {
					return p.unsupported("all_check", "a check of a set of two live leases %s changed %d rows instead of %d", step.by, n, step.want)
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := each("release with a minimum hold", proofTTL); err != nil {
			return err
		}
		// all_release_at_least left the leases under the token's released
		// form, which a forced release deletes them by.
		mine = NewSet(names, s.cfg.Released(a))
		if err := each("release", 0); err != nil {
			return err
		}
		if s.Forms().OneRow {
			return nil // a lease row is never deleted there
		}
		// The lease rows are gone, the fence rows stay: a refresh by the
		// owner must fail with 1690 too, not extend what is left of a set.
		return p.refreshRefused(s.SetRefresh(NewSet(names, a), proofTTL), "a set whose lease rows were deleted",
			"the LEFT JOIN to a missing lease row")
	})
}

// refreshRefused sends all_refresh's text q, a refresh of what, and returns
// nil when it fails with 1690 (not the session guard's), as it must: an
// error naming what raised no error (cause) when it succeeds.
func (p *prover) refreshRefused(q, what, cause string) error {
	err := fault.RetryRolledBack(p.ctx, func() error {
		_, err := p.conn.ExecContext(p.ctx, q)
		return err
	})
	if err == nil {
		return p.unsupported("all_refresh", "a refresh of %s succeeded: %s raised no error (1690)", what, cause)
	}
	if n, ok := fault.Errno(err); !ok || n != fault.OutOfRange || SessionGuard(err) != "" {
		return p.failed("all_refresh", "refresh "+what+", which must fail with 1690", err)
	}
	return nil
}

// proveSetFences reads back, as ReadFences does on the one-row forms, the
// fences of set just taken with the one-row form.
func (p *prover) proveSetFences(set *Set) error {
	found, err := p.s.readFencesOn(p.ctx, p.conn, set, fault.RetryRolledBack)
	if err != nil {
		return p.failed("all_fences", "read the fences of a set just taken", err)
	}
	if found != len(set.Names) {
		return p.unsupported("all_acquire", "an acquire of a set of %d free names took %d of them", len(set.Names), found)
	}
	for i, fence := range set.Fences {
		if fence == 0 {
			return p.unsupported("all_fences", "a set just taken has fence 0 on %q", set.Names[i])
		}
	}
	return nil
}
