package sqllocktest

import "strconv"

// Sets: the statements of a Lock on several names (queries.sql, all_*),
// each as MySQL runs it. A Client sends them as text: the literals are in
// x.p.lits, and all_acquire's rows, each one of setRows, in x.p.rows.
// all_fences, which only the one-row forms use, is not run (notImplemented).

// setRefs locks the lease rows of the names listed from literal first on.
func setRefs(first int) func(x *call) []rowRef {
	return func(x *call) []rowRef {
		var refs []rowRef
		for i := first; i < len(x.p.lits); i++ {
			refs = append(refs, x.ref(x.p.lits[i], 'L'))
		}
		return refs
	}
}

// setAcquireRefs returns the rows all_acquire waits for: InnoDB locks the
// rows one by one, in the statement's order, so it waits for each row a
// transaction holds, up to the first lease row it finds held live by
// another owner, where the statement fails (error 1690) without going on.
func setAcquireRefs(x *call) []rowRef {
	var refs []rowRef
	now := x.s.nowMicros()
	for _, r := range x.p.rows {
		if len(r.lits) == 0 {
			continue
		}
		kind := byte('F')
		if r.name == "all_acquire_lease" {
			kind = 'L'
		}
		ref := x.ref(r.lits[0], kind)
		refs = append(refs, ref)
		if kind == 'L' && len(x.p.lits) > 0 && x.s.blocker(x.c, []rowRef{ref}) == nil {
			if old := x.s.read(x.c, ref); old != nil && old.owner != x.p.lits[0] && old.expires > now {
				break
			}
		}
	}
	return refs
}

// setNames returns the names listed from literal first on, each once, as
// IN reads them.
func setNames(x *call, first int) []string {
	return unique(x.p.lits[min(first, len(x.p.lits)):])
}

// unique returns lits without repeats, in order.
func unique(lits []string) []string {
	var names []string
	seen := map[string]bool{}
	for _, n := range lits {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return names
}

// litInt reads literal i as a whole number.
func litInt(x *call, i int) (int64, error) {
	if i >= len(x.p.lits) {
		return 0, errSyntax(x.p.t.name)
	}
	return strconv.ParseInt(x.p.lits[i], 10, 64)
}

// allAcquire: the rows (x.p.rows), then token, holder, ttl µs, token. Each
// row is inserted, or updated by the ON DUPLICATE KEY UPDATE part, in
// order, as MySQL writes a multi-row INSERT; lid follows LAST_INSERT_ID()
// through the statement, from the session's value. A lease row held live
// by another owner fails the statement with error 1690, and run undoes
// what the rows before it wrote.
func allAcquire(x *call) (*outcome, error) {
	if len(x.p.lits) != 4 {
		return nil, errSyntax(x.p.t.name)
	}
	updOwner, updHolder, updOwner2 := x.p.lits[0], x.p.lits[1], x.p.lits[3]
	updTTL, err := litInt(x, 2)
	if err != nil {
		return nil, err
	}
	lid, set := x.c.lastInsertID, false
	out := &outcome{}
	for _, pr := range x.p.rows {
		name := pr.lits[0]
		// The row's VALUES, evaluated whether or not the row is there.
		kind := byte('F')
		nr := &row{acquired: x.now, expires: x.now}
		switch pr.name {
		case "all_acquire_lease":
			kind = 'L'
			ttl, err := strconv.ParseInt(pr.lits[3], 10, 64)
			if err != nil {
				return nil, err
			}
			nr.owner, nr.holder = pr.lits[1], pr.lits[2]
			if nr.expires, err = plus(x.now, ttl, "expires_at"); err != nil {
				return nil, err
			}
		case "all_acquire_fence_first":
			// LAST_INSERT_ID(2 * TIMESTAMPDIFF(MICROSECOND, epoch, now)) DIV 2
			lid, set = 2*uint64(x.now), true
			nr.fence = lid / 2
		case "all_acquire_fence":
			nr.fence = lid / 2
		case "all_acquire_fence_write":
			lid, set = lid|1, true // LAST_INSERT_ID(LAST_INSERT_ID() | 1) * 0
		}
		ref := x.ref(name, kind)
		old := x.s.read(x.c, ref)
		if old == nil {
			x.s.write(x.c, ref, nr)
			out.affected++
			continue
		}
		r := *old
		if kind == 'L' {
			if old.owner != updOwner && old.expires > x.now {
				// fence + 1 + 18446744073709551615
				return nil, errOutOfRange("((`" + x.p.table + "`.`fence` + 1) + 18446744073709551615)")
			}
			r.acquired, r.holder, r.owner = x.now, updHolder, updOwner2
			exp, err := plus(x.now, updTTL, "expires_at")
			if err != nil {
				return nil, err
			}
			r.expires = max(r.expires, exp) // GREATEST: never earlier
		} else if lid&1 == 0 {
			// The first pass: LAST_INSERT_ID(GREATEST(fence + 1, lid DIV 2) * 2) * 0 + fence.
			if old.fence == 1<<64-1 {
				return nil, errOutOfRange("(`" + x.p.table + "`.`fence` + 1)")
			}
			m := max(old.fence+1, lid/2)
			if m > (1<<64-1)/2 {
				return nil, errOutOfRange("(greatest((`" + x.p.table + "`.`fence` + 1),(last_insert_id() DIV 2)) * 2)")
			}
			lid, set = m*2, true
		} else {
			r.fence = lid / 2 // the second pass writes M
		}
		if x.s.write(x.c, ref, &r) {
			out.affected += 2
		}
	}
	if set {
		x.c.lastInsertID = lid
		out.lastID = lid
	}
	return out, nil
}

// eachOwned runs f on the lease row of each name of the set listed from
// literal first on that token owns (and, with live, that has not expired),
// writing what f leaves in it; the affected rows count them, since every
// matched row changes. A row read and not matched is locked all the same,
// as check's is.
func eachOwned(x *call, first int, live bool, f func(r *row) (*row, error)) (*outcome, error) {
	if len(x.p.lits) <= first {
		return nil, errSyntax(x.p.t.name)
	}
	return eachOwnedOf(x, setNames(x, first), x.p.lits[first-1], live, f)
}

// eachOwnedOf is eachOwned on the given names and token.
func eachOwnedOf(x *call, names []string, token string, live bool, f func(r *row) (*row, error)) (*outcome, error) {
	out := &outcome{}
	for _, name := range names {
		ref := x.ref(name, 'L')
		r := x.leaseRow(name, token, live)
		if r == nil {
			x.s.lockRow(x.c, ref)
			continue
		}
		r, err := f(r)
		if err != nil {
			return nil, err
		}
		x.s.write(x.c, ref, r)
		out.affected++
	}
	return out, nil
}

// flip flips the lowest bit of acquired_at's microseconds, so that the row
// changes: acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND.
func flip(r *row) {
	if r.acquired%2 == 0 {
		r.acquired++
	} else {
		r.acquired--
	}
}

// all_refresh: the names, then ttl µs, token.
func allRefresh(x *call) (*outcome, error) {
	n := len(x.p.lits)
	if n < 3 {
		return nil, errSyntax(x.p.t.name)
	}
	us, err := litInt(x, n-2)
	if err != nil {
		return nil, err
	}
	token := x.p.lits[n-1]
	names := unique(x.p.lits[:n-2])
	// All or nothing: a lease row of the set that is not ours and live, or
	// missing (the LEFT JOIN from the names), fails the statement (1690)
	// before anything is written.
	for _, name := range names {
		if r := x.s.read(x.c, x.ref(name, 'L')); r == nil || r.owner != token || r.expires <= x.now {
			return nil, errOutOfRange("(length(`w`.`name`) + 18446744073709551615)")
		}
	}
	return eachOwnedOf(x, names, token, true, func(r *row) (*row, error) {
		e, err := plus(x.now, us, "expires_at")
		if err != nil {
			return nil, err
		}
		r.expires = max(r.expires, e)
		flip(r)
		return r, nil
	})
}

// allRefreshRefs returns the rows all_refresh locks: the lease rows of its
// names, which come first.
func allRefreshRefs(x *call) []rowRef {
	var refs []rowRef
	for i := 0; i < len(x.p.lits)-2; i++ {
		refs = append(refs, x.ref(x.p.lits[i], 'L'))
	}
	return refs
}

// all_release_at_least: min hold µs, token, the names. expires_at is set
// from the old acquired_at.
func allReleaseAtLeast(x *call) (*outcome, error) {
	us, err := litInt(x, 0)
	if err != nil {
		return nil, err
	}
	if len(x.p.lits) <= 2 {
		return nil, errSyntax(x.p.t.name)
	}
	token := x.p.lits[1]
	out := &outcome{}
	for _, name := range setNames(x, 2) {
		ref := x.ref(name, 'L')
		old := x.s.read(x.c, ref)
		owned := false
		if old != nil {
			if owned, err = x.ownedOrReleased(old.owner, token); err != nil {
				return nil, err
			}
		}
		if !owned {
			x.s.lockRow(x.c, ref)
			continue
		}
		if err := x.guard(); err != nil { // in SET, for each row found
			return nil, err
		}
		r := *old
		var err error
		if r.expires, err = plus(r.acquired, us, "expires_at"); err != nil {
			return nil, err
		}
		flip(&r)
		r.owner = releasedOwner(r.owner)
		x.s.write(x.c, ref, &r)
		out.affected++
	}
	return out, nil
}

// all_release: token, the names. A DELETE.
func allRelease(x *call) (*outcome, error) {
	return eachOwned(x, 1, false, func(*row) (*row, error) { return nil, nil })
}

// all_check: token, the names; sent inside the user's transaction.
func allCheck(x *call) (*outcome, error) {
	return eachOwned(x, 1, true, func(r *row) (*row, error) {
		flip(r)
		return r, nil
	})
}
