package sqllocktest

import "database/sql/driver"

// A frozen holder (queries.sql): the fake reads the lease as the library's
// watch asks, and keeps no lock-wait tables, so it names no blocker and the
// library never sends frozen_kill to it: an acquire behind an open
// Lock.Check transaction waits for that transaction as it always did.

// frozenLease: the lease's holder and how many µs ago it ended (negative:
// how long it has left); no row when the name has no lease.
func frozenLease(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	out := &outcome{cols: []string{"holder", "past_us"}}
	if l := x.s.read(x.c, x.ref(name, 'L')); l != nil {
		out.rows = append(out.rows, []driver.Value{[]byte(l.holder), x.now - l.expires})
	}
	return out, nil
}

// frozenBlockers: no connection, as a server with nobody waiting answers.
func frozenBlockers(*call) (*outcome, error) {
	return &outcome{cols: []string{"PROCESSLIST_ID"}}, nil
}
