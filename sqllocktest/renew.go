package sqllocktest

import (
	"database/sql/driver"
	"sort"
)

// renew_many, the Client's shared renewal: the leases it keeps alive for
// one ttl, extended in one statement sent as text. Its literals, in
// x.p.lits: the ttl µs, the names (the first list), then each lease's
// owner and name, concatenated (the second list, one pair a name).
// renew_found, sent after a renew_many that extended fewer leases than it
// carried, takes the same two lists without the ttl.

// renewListsOf reads a statement whose literals are lead single ones
// (renew_many's ttl), then the names, then the pairs: it returns the names
// each once, in the primary key's order (the order its range reads and
// locks the rows in), and the pairs as a set; ok is false when the
// literals are not that.
func renewListsOf(x *call, lead int) (names []string, pairs map[string]bool, ok bool) {
	lits := x.p.lits
	if len(x.p.lists) != 2 || len(lits) != lead+x.p.lists[0]+x.p.lists[1] {
		return nil, nil, false
	}
	k := lead + x.p.lists[0]
	names = unique(lits[lead:k])
	sort.Strings(names) // VARBINARY: byte by byte, as Go compares strings
	pairs = map[string]bool{}
	for _, p := range lits[k:] {
		pairs[p] = true
	}
	return names, pairs, true
}

// renewManyRefs returns the rows renew_many locks: the lease rows of its
// names, in the key's order.
func renewManyRefs(x *call) []rowRef {
	names, _, ok := renewListsOf(x, 1)
	if !ok {
		return nil // run reports it
	}
	refs := make([]rowRef, len(names))
	for i, name := range names {
		refs[i] = x.ref(name, 'L')
	}
	return refs
}

// renewMany: ttl µs, the names, the pairs. Each lease row of a listed name
// that the range finds meets the session guard (MariaDB's part fails the
// statement inside a transaction for any such row, whoever owns it; a
// name without a lease row reaches nothing); the row is then extended only
// if CONCAT(owner, name) is one of the pairs and it is live. A row matched
// once is written once, however many pairs name it. The expiry never moves
// earlier; acquired_at's flip makes every matched row change, so the
// affected rows count the rows extended.
func renewMany(x *call) (*outcome, error) {
	names, pairs, ok := renewListsOf(x, 1)
	if !ok {
		return nil, errSyntax(x.p.t.name)
	}
	us, err := litInt(x, 0)
	if err != nil {
		return nil, err
	}
	out := &outcome{}
	for _, name := range names {
		ref := x.ref(name, 'L')
		r := x.s.read(x.c, ref)
		if r == nil {
			x.s.lockRow(x.c, ref)
			continue
		}
		if err := x.guard(); err != nil {
			return nil, err
		}
		if !pairs[r.owner+name] || r.expires <= x.now {
			x.s.lockRow(x.c, ref)
			continue
		}
		e, err := plus(x.now, us, "expires_at")
		if err != nil {
			return nil, err
		}
		r.expires = max(r.expires, e)
		flip(r)
		if x.s.write(x.c, ref, r) { // changed rows, as without clientFoundRows
			out.affected++
		}
	}
	return out, nil
}

// renewFound: the names, the pairs. A plain SELECT, a consistent read: it
// takes no lock, waits for none, and reads a row another transaction
// wrote as last committed (read). One row, CONCAT(owner, name), for each
// lease row of a listed name that is one of the pairs and live, in name
// order; a name listed twice is found once, as IN does.
func renewFound(x *call) (*outcome, error) {
	names, pairs, ok := renewListsOf(x, 0)
	if !ok {
		return nil, errSyntax(x.p.t.name)
	}
	out := &outcome{cols: []string{"CONCAT(owner, name)"}}
	for _, name := range names {
		r := x.s.read(x.c, x.ref(name, 'L'))
		if r != nil && pairs[r.owner+name] && r.expires > x.now {
			out.rows = append(out.rows, []driver.Value{[]byte(r.owner + name)})
		}
	}
	return out, nil
}
