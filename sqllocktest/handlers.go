package sqllocktest

import (
	"database/sql/driver"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
)

// The statements of queries.sql, each as MySQL runs it: the same rows
// written, the same rows returned, the same insert id and affected rows in
// the OK packet. Comments name only what the Go does differently from
// reading the SQL; queries.sql says why each statement is as it is.

var handlers = map[string]*handler{
	"acquire": {needsTable: true, writes: true, guardFirst: true, locks: refsOf(0, "LF"), run: acquire},
	// acquire_attached is acquire where acquire found an attached lease
	// (queries.sql), which the fake never has: it answers as acquire.
	"acquire_attached":       {needsTable: true, writes: true, guardFirst: true, locks: refsOf(0, "LF"), run: acquire},
	"refresh":                {needsTable: true, writes: true, locks: refsOf(1, "L"), run: refresh},
	"release":                {needsTable: true, writes: true, locks: refsOf(0, "L"), run: release},
	"force_release":          {needsTable: true, writes: true, locks: litRefs(0, 1), run: forceRelease},
	"release_at_least":       {needsTable: true, writes: true, locks: refsOf(1, "L"), run: releaseAtLeast},
	"check":                  {needsTable: true, writes: true, locks: refsOf(0, "L"), run: check},
	"inspect":                {needsTable: true, run: inspect},
	"list":                   {needsTable: true, run: list},
	"look":                   {needsTable: true, run: look},
	"lease":                  {needsTable: true, run: lease},
	"lock_delay":             {needsTable: true, writes: true, locks: refsOf(3, "L"), run: lockDelay},
	"once_done":              {needsTable: true, run: onceDone},
	"once_record":            {needsTable: true, writes: true, locks: refsOf(0, "LD"), run: onceRecord},
	"once_reset":             {needsTable: true, writes: true, locks: refsOf(0, "D"), run: onceReset},
	"proof_clear":            {needsTable: true, writes: true, locks: refsOf(0, "LFD"), run: proofClear},
	"all_acquire":            {needsTable: true, writes: true, guardFirst: true, locks: setAcquireRefs, run: allAcquire}, // sets.go
	"all_refresh":            {needsTable: true, writes: true, guardFirst: true, locks: allRefreshRefs, run: allRefresh},
	"all_release":            {needsTable: true, writes: true, locks: setRefs(1), run: allRelease},
	"all_release_at_least":   {needsTable: true, writes: true, locks: setRefs(2), run: allReleaseAtLeast},
	"all_check":              {needsTable: true, writes: true, locks: setRefs(1), run: allCheck},
	"renew_many":             {needsTable: true, writes: true, locks: renewManyRefs, run: renewMany},                       // renew.go
	"renew_found":            {needsTable: true, run: renewFound},                                                          // renew.go
	"slot_acquire":           {needsTable: true, writes: true, guardFirst: true, locks: slotAcquireRefs, run: slotAcquire}, // semaphores.go
	"slot_release":           {needsTable: true, writes: true, locks: slotReleaseRefs, run: slotRelease},
	"slot_list":              {needsTable: true, run: slotList},
	"first_use":              {run: firstUse},
	"wake_wait":              {run: wakeWait},
	"wake_release":           {run: wakeRelease},
	"wake_probe":             {run: wakeProbe},
	"wake_holder":            {run: wakeHolder},
	"test_set_fence":         {needsTable: true, writes: true, locks: refsOf(0, "LFD"), run: setFence},
	"test_set_fence_g":       {needsTable: true, writes: true, run: setFence},
	"wake_waiters":           {run: wakeWaiters},
	"version":                {run: version},
	"carries":                {run: carries},
	"server_mysql":           {run: serverFacts},
	"server_mysql_plain":     {run: serverFacts},
	"server_mariadb":         {run: serverFacts},
	"proof_engine":           {needsTable: true, run: proofEngine},
	"frozen_lease":           {needsTable: true, run: frozenLease},    // frozen.go
	"frozen_blocker_mysql":   {needsTable: true, run: frozenBlockers}, // frozen.go
	"frozen_blocker_mariadb": {needsTable: true, run: frozenBlockers}, // frozen.go
	"proof_overflow":         {needsTable: true, run: proofOverflow},
	"schema":                 {writes: true, run: createTable},
	"drop_table":             {writes: true, run: dropTable},
	"drop_table_if_exists":   {writes: true, run: dropTable},
}

// acquire: args name, token, holder, ttl µs, name; then token, holder,
// token, ttl µs. lid follows the session's LAST_INSERT_ID() through the
// statement: the OK packet's insert id is its last value set.
func acquire(x *call) (*outcome, error) {
	a, err := x.strs(0, 1, 2, 4, 5, 6, 7)
	if err != nil {
		return nil, err
	}
	name, token, holder, fname, updOwner, updHolder, updOwner2 := a[0], a[1], a[2], a[3], a[4], a[5], a[6]
	ttl, err := x.int(3)
	if err != nil {
		return nil, err
	}
	updTTL, err := x.int(8)
	if err != nil {
		return nil, err
	}
	out := &outcome{}
	// Row 1, the lease: VALUES evaluates LAST_INSERT_ID(1) first.
	lid := uint64(1)
	lref := x.ref(name, 'L')
	if old := x.s.read(x.c, lref); old == nil {
		exp, err := plus(x.now, ttl, "expires_at")
		if err != nil {
			return nil, err
		}
		x.s.write(x.c, lref, &row{owner: token, holder: holder, acquired: x.now, expires: exp})
		out.affected++
	} else {
		r := *old
		mark := uint64(0)
		switch {
		case old.owner == updOwner:
			mark = 2
		case old.expires <= x.now:
			mark = 1
		}
		lid = mark + old.fence
		r.fence = 0
		if lid == 1 {
			r.acquired = x.now
		}
		if lid == 1 || lid == 2 {
			r.holder = updHolder
		}
		if lid == 1 {
			r.owner = updOwner2
		}
		if lid == 1 || lid == 2 {
			// GREATEST(expires_at, now + ttl): never earlier.
			exp, err := plus(x.now, updTTL, "expires_at")
			if err != nil {
				return nil, err
			}
			r.expires = max(r.expires, exp)
		}
		if x.s.write(x.c, lref, &r) {
			out.affected += 2
		}
	}
	// Row 2, the fence.
	first := uint64(0)
	if lid == 1 {
		lid = uint64(x.now) // TIMESTAMPDIFF(MICROSECOND, epoch, UTC_TIMESTAMP(6))
		first = lid
	}
	fref := x.ref(fname, 'F')
	if old := x.s.read(x.c, fref); old == nil {
		x.s.write(x.c, fref, &row{fence: first, acquired: x.now, expires: x.now})
		out.affected++
	} else {
		r := *old
		switch {
		case lid == 2:
			lid = old.fence
		case lid > 2:
			if old.fence == 1<<64-1 {
				return nil, errOutOfRange("(`" + x.p.table + "`.`fence` + 1)")
			}
			lid = max(old.fence+1, lid)
			r.fence = lid
		}
		if x.s.write(x.c, fref, &r) {
			out.affected += 2
		}
	}
	out.lastID = lid
	return out, nil
}

// leaseRow returns the lease row of name if token owns it (and, with live,
// if it has not expired), for the UPDATEs on it.
func (x *call) leaseRow(name, token string, live bool) *row {
	r := x.s.read(x.c, x.ref(name, 'L'))
	if r == nil || r.owner != token || live && r.expires <= x.now {
		return nil
	}
	return r
}

// refresh: args ttl µs, name, token. The expiry never moves earlier.
func refresh(x *call) (*outcome, error) {
	return bump(x, func(r *row, us int64) error {
		e, err := plus(x.now, us, "expires_at")
		r.expires = max(r.expires, e)
		return err
	}, true)
}

// release_at_least: args min hold µs, name, token. The owner becomes the
// token's released form, which a repeat matches too.
func releaseAtLeast(x *call) (*outcome, error) {
	return bump(x, func(r *row, us int64) error {
		var err error
		r.expires, err = plus(r.acquired, us, "expires_at")
		r.owner = releasedOwner(r.owner)
		return err
	}, false)
}

// releasedOwner is IF(LENGTH(owner) = 32, TO_BASE64(UNHEX(owner)), owner).
func releasedOwner(owner string) string {
	if len(owner) != 32 {
		return owner
	}
	b, err := hex.DecodeString(owner)
	if err != nil {
		return "" // UNHEX gives NULL; a token is hex
	}
	return base64.StdEncoding.EncodeToString(b)
}

// ownedOrReleased reports ? IN (owner, IF(LENGTH(owner) = 24,
// LOWER(HEX(FROM_BASE64(owner))), NULL)), in a statement that writes:
// there MariaDB's strict sql_mode fails the statement on an owner of 24
// characters that is not base64 (error 1958), where MySQL's FROM_BASE64
// gives NULL; an owner of another length is never decoded.
func (x *call) ownedOrReleased(owner, token string) (bool, error) {
	if owner == token {
		return true, nil
	}
	if len(owner) != 24 {
		return false, nil
	}
	b, err := base64.StdEncoding.DecodeString(owner)
	var bad base64.CorruptInputError
	if errors.As(err, &bad) && x.s.mariadb {
		return false, errBadBase64(int64(bad))
	}
	return err == nil && owner != "" && hex.EncodeToString(b) == token, nil
}

// bump runs refresh and release_at_least, which differ in the expiry they
// set and in whether the lease must be live: the insert id is the fence
// plus one (1) when the row matched, and the fence column stays 0.
func bump(x *call, set func(*row, int64) error, live bool) (*outcome, error) {
	us, err := x.int(0)
	if err != nil {
		return nil, err
	}
	a, err := x.strs(1, 2)
	if err != nil {
		return nil, err
	}
	r := x.leaseRow(a[0], a[1], false)
	if !live {
		// release_at_least: the token or its released form.
		if r = x.s.read(x.c, x.ref(a[0], 'L')); r != nil {
			if ok, err := x.ownedOrReleased(r.owner, a[1]); err != nil {
				return nil, err
			} else if !ok {
				r = nil
			}
		}
	}
	if r == nil {
		return &outcome{}, nil
	}
	// refresh's WHERE reads the guard after the owner, before the expiry;
	// release_at_least's SET, for the row its WHERE found.
	if err := x.guard(); err != nil {
		return nil, err
	}
	if live && r.expires <= x.now {
		return &outcome{}, nil
	}
	if r.fence == 1<<64-1 {
		return nil, errOutOfRange("(`" + x.p.table + "`.`fence` + 1)")
	}
	out := &outcome{lastID: r.fence + 1}
	r.fence = 0
	if err := set(r, us); err != nil {
		return nil, err
	}
	if x.s.write(x.c, x.ref(a[0], 'L'), r) {
		out.affected = 1
	}
	return out, nil
}

// release: args name, token.
func release(x *call) (*outcome, error) {
	a, err := x.strs(0, 1)
	if err != nil {
		return nil, err
	}
	if x.leaseRow(a[0], a[1], false) == nil {
		return &outcome{}, nil
	}
	x.s.write(x.c, x.ref(a[0], 'L'), nil)
	return &outcome{affected: 1}, nil
}

// force_release: literals name, token, as release's arguments: the fake
// attaches no lease (queries.sql), so it is release.
func forceRelease(x *call) (*outcome, error) {
	if len(x.p.lits) != 2 {
		return nil, errSyntax(x.p.t.name)
	}
	x.args = []driver.Value{x.p.lits[0], x.p.lits[1]}
	return release(x)
}

// litRefs returns the lease rows named by the literals from first up to
// end (exclusive) of a statement sent as text.
func litRefs(first, end int) func(x *call) []rowRef {
	return func(x *call) []rowRef {
		var refs []rowRef
		for i := first; i < end && i < len(x.p.lits); i++ {
			refs = append(refs, x.ref(x.p.lits[i], 'L'))
		}
		return refs
	}
}

// check: args name, token; sent inside the user's transaction.
func check(x *call) (*outcome, error) {
	a, err := x.strs(0, 1)
	if err != nil {
		return nil, err
	}
	r := x.leaseRow(a[0], a[1], true)
	if r == nil {
		// InnoDB locks the row it read even when the WHERE rejects it.
		x.s.lockRow(x.c, x.ref(a[0], 'L'))
		return &outcome{}, nil
	}
	if r.acquired%2 == 0 {
		r.acquired++
	} else {
		r.acquired--
	}
	x.s.write(x.c, x.ref(a[0], 'L'), r)
	return &outcome{affected: 1}, nil
}

// inspect: args name. One row when the name has a fence row.
func inspect(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	out := &outcome{cols: []string{"holder", "fence", "live", "left_us", "ahead_us", "min_hold"}}
	f := x.s.read(x.c, x.ref(name, 'F'))
	if f == nil {
		return out, nil
	}
	l := x.s.read(x.c, x.ref(name, 'L'))
	if l == nil {
		out.rows = append(out.rows, []driver.Value{nil, fenceValue(f.fence), nil, nil, nil, nil})
		return out, nil
	}
	out.rows = append(out.rows, []driver.Value{[]byte(l.holder), fenceValue(f.fence), boolValue(l.expires > x.now), l.expires - x.now, l.acquired - x.now,
		boolValue(len(l.owner) == 24)})
	return out, nil
}

// look: the names of the list whose lease is live; a name listed twice
// comes back once, as IN does.
func look(x *call) (*outcome, error) {
	out := &outcome{cols: []string{"name"}}
	seen := make(map[string]bool, len(x.p.lits))
	for _, name := range x.p.lits {
		if seen[name] {
			continue
		}
		seen[name] = true
		if l := x.s.read(x.c, x.ref(name, 'L')); l != nil && l.owner != "" && l.expires > x.now {
			out.rows = append(out.rows, []driver.Value{[]byte(name)})
		}
	}
	return out, nil
}

// list: every live lease, in name order (VARBINARY compares bytes).
func list(x *call) (*outcome, error) {
	out := &outcome{cols: []string{"name", "holder", "fence", "left_us", "ahead_us"}}
	var names []string
	for _, k := range x.s.keys(x.c, x.p.table) {
		if k.kind == 'L' {
			names = append(names, k.name)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		l := x.s.read(x.c, x.ref(n, 'L'))
		if l == nil || l.expires <= x.now {
			continue
		}
		out.rows = append(out.rows, []driver.Value{[]byte(n), []byte(l.holder), fenceValue(x.fenceOf(n)), l.expires - x.now, l.acquired - x.now})
	}
	return out, nil
}

// fenceOf returns the fence of the lease row named name, as list and lease
// join it: a semaphore's slot (named with 0x00 'slot' and two digits) has
// its semaphore's, in the fence row named without the digits; 0 when there
// is no fence row.
func (x *call) fenceOf(name string) uint64 {
	const mark = "\x00slot"
	n := len(name)
	if n >= len(mark)+2 && name[n-2-len(mark):n-2] == mark && isDigit(name[n-2]) && isDigit(name[n-1]) {
		name = name[:n-2]
	}
	if f := x.s.read(x.c, x.ref(name, 'F')); f != nil {
		return f.fence
	}
	return 0
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// lease: args name. The lease row, live or not, with its fence, and
// whether it is attached to a session: never here, where no statement
// attaches one (queries.sql).
func lease(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	out := &outcome{cols: []string{"owner", "holder", "fence", "live", "left_us", "attached"}}
	l := x.s.read(x.c, x.ref(name, 'L'))
	if l == nil {
		return out, nil
	}
	out.rows = append(out.rows, []driver.Value{[]byte(l.owner), []byte(l.holder), fenceValue(x.fenceOf(name)), boolValue(l.expires > x.now), l.expires - x.now, boolValue(false)})
	return out, nil
}

// lock_delay: args the delay in µs or NULL (the default), owner, holder,
// name, token. The insert id is the delay.
func lockDelay(x *call) (*outcome, error) {
	a, err := x.strs(1, 2, 3, 4)
	if err != nil {
		return nil, err
	}
	owner, holder, name, token := a[0], a[1], a[2], a[3]
	old := x.leaseRow(name, token, false)
	if old == nil {
		return &outcome{}, nil
	}
	if err := x.guard(); err != nil {
		return nil, err
	}
	var us int64
	if x.args[0] == nil {
		left := max(old.expires-x.now, 0)
		us = left/3 + min(left/5, 6_000_000)
	} else if us, err = x.int(0); err != nil {
		return nil, err
	} else if us < 0 {
		// COALESCE(..) + the guard's unsigned 0.
		return nil, errOutOfRange("coalesce(?,...) + ...")
	}
	r := *old
	if r.expires, err = plus(x.now, us, "expires_at"); err != nil {
		return nil, err
	}
	r.owner, r.holder = owner, holder
	out := &outcome{lastID: uint64(us)}
	if x.s.write(x.c, x.ref(name, 'L'), &r) {
		out.affected = 1
	}
	return out, nil
}

// once_done: args name.
func onceDone(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	out := &outcome{cols: []string{"1"}}
	if x.s.read(x.c, x.ref(name, 'D')) != nil {
		out.rows = append(out.rows, []driver.Value{int64(1)})
	}
	return out, nil
}

// once_record: args name, token. The lease row is read FOR UPDATE.
func onceRecord(x *call) (*outcome, error) {
	a, err := x.strs(0, 1)
	if err != nil {
		return nil, err
	}
	x.s.lockRow(x.c, x.ref(a[0], 'L'))
	l := x.leaseRow(a[0], a[1], false)
	if l == nil {
		return &outcome{}, nil
	}
	dref := x.ref(a[0], 'D')
	if x.s.read(x.c, dref) != nil {
		return nil, errDuplicate(x.p.table, a[0], 'D')
	}
	if l.fence == 1<<64-1 {
		return nil, errOutOfRange("(`l`.`fence` + 1)")
	}
	x.s.write(x.c, dref, &row{owner: l.owner, holder: l.holder, acquired: x.now, expires: x.now})
	return &outcome{lastID: l.fence + 1, affected: 1}, nil
}

// once_reset: args name.
func onceReset(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	ref := x.ref(name, 'D')
	if x.s.read(x.c, ref) == nil {
		return &outcome{}, nil
	}
	x.s.write(x.c, ref, nil)
	return &outcome{affected: 1}, nil
}

// proof_clear: args name. Every row of the name, whatever its kind.
func proofClear(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	out := &outcome{}
	for _, k := range x.s.keys(x.c, x.p.table) {
		if k.name == name && x.s.read(x.c, x.ref(name, k.kind)) != nil {
			x.s.write(x.c, x.ref(name, k.kind), nil)
			out.affected++
		}
	}
	return out, nil
}

// version: SELECT VERSION().
// carries: LAST_INSERT_ID(LAST_INSERT_ID() XOR ?), then LAST_INSERT_ID():
// as on MySQL, the second column reads back what the first set.
func carries(x *call) (*outcome, error) {
	flip, err := x.int(0)
	if err != nil {
		return nil, err
	}
	x.c.lastInsertID ^= uint64(flip)
	v := int64(x.c.lastInsertID)
	return &outcome{cols: []string{"set", "read"}, rows: [][]driver.Value{{v, v}}}, nil
}

func version(x *call) (*outcome, error) {
	return &outcome{cols: []string{"VERSION()"}, rows: [][]driver.Value{{[]byte(x.s.version)}}}, nil
}

// createTable: schema.sql's CREATE TABLE IF NOT EXISTS.
func createTable(x *call) (*outcome, error) {
	if x.table == nil {
		x.s.tables[x.p.table] = newTable()
	}
	return &outcome{}, nil
}

// dropTable: DROP TABLE [IF EXISTS], which test harnesses send to clean up.
func dropTable(x *call) (*outcome, error) {
	if x.table == nil {
		if x.p.t.name == "drop_table" {
			return nil, errUnknownTable(x.p.table)
		}
		return &outcome{}, nil
	}
	for ref, h := range x.s.rowLks {
		if ref.table == x.p.table && h != x.c {
			return nil, LockWaitTimeout // MySQL waits for the metadata lock
		}
	}
	delete(x.s.tables, x.p.table)
	return &outcome{}, nil
}

// firstUse: the session and server, then the table as information_schema
// describes it: schema.sql's, as MySQL 8.4 shows it, or MariaDB 10.11.
func firstUse(x *call) (*outcome, error) {
	out := &outcome{cols: []string{"what", "f1", "f2", "f3", "f4", "f5", "f6"}}
	out.rows = append(out.rows, []driver.Value{[]byte("server"), int64(1), []byte(x.s.version), int64(0), []byte(Database), nil, nil})
	if x.table == nil {
		return out, nil
	}
	t := []byte(x.p.table)
	out.rows = append(out.rows, []driver.Value{[]byte("table"), t, []byte("InnoDB"), nil, nil, nil, nil})
	for _, c := range [][2]string{
		{"name", "varbinary(255)"}, {"kind", "binary(1)"}, {"owner", "varbinary(32)"},
		{"holder", "varbinary(255)"}, {"fence", x.s.bigint()},
		{"acquired_at", "datetime(6)"}, {"expires_at", "datetime(6)"},
	} {
		out.rows = append(out.rows, []driver.Value{[]byte("column"), t, []byte(c[0]), []byte(c[1]), []byte("NO"), nil, nil})
	}
	for i, c := range []string{"name", "kind"} {
		out.rows = append(out.rows, []driver.Value{[]byte("index"), t, []byte("PRIMARY"), int64(0), int64(i + 1), []byte(c), nil})
	}
	return out, nil
}

// setFence: the library's fence tests' own UPDATE; args fence, then the
// name unless the statement names it.
func setFence(x *call) (*outcome, error) {
	var v any
	if x.p.t.name == "test_set_fence" {
		u, err := strconv.ParseUint(x.p.lits[0], 10, 64) // matched as digits
		if err != nil {
			return nil, err
		}
		v = u
	} else {
		v = x.args[0]
	}
	var fence uint64
	switch f := v.(type) {
	case uint64:
		fence = f
	case int64:
		if f < 0 {
			return nil, errOutOfRange("fence")
		}
		fence = uint64(f)
	default:
		return nil, fmt.Errorf("sqllocktest: %s: the fence is %T, want a whole number", x.p.t.name, v)
	}
	name := "g"
	if x.p.t.name == "test_set_fence" {
		var err error
		if name, err = x.str(0); err != nil {
			return nil, err
		}
	}
	out := &outcome{}
	for _, k := range x.s.keys(x.c, x.p.table) {
		if k.name != name {
			continue
		}
		ref := x.ref(name, k.kind)
		r := x.s.read(x.c, ref)
		if r == nil {
			continue
		}
		r.fence = 0
		if k.kind == 'F' {
			r.fence = fence
		}
		r.expires = x.now - 1_000_000
		if x.s.write(x.c, ref, r) {
			out.affected++
		}
	}
	return out, nil
}

// serverFacts: a writable server, and its identity: the fake's, one per
// process. Its Group Replication group is empty (no group).
func serverFacts(x *call) (*outcome, error) {
	return &outcome{cols: []string{"read_only", "super_read_only", "id", "group"},
		rows: [][]driver.Value{{int64(0), int64(0), []byte("sqllocktest " + x.s.version), []byte("")}}}, nil
}

// proof_engine: args name. The lease row's owner, its length in µs, and
// the one microsecond added to the clock.
func proofEngine(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	out := &outcome{cols: []string{"owner", "length", "one"}}
	if l := x.s.read(x.c, x.ref(name, 'L')); l != nil {
		out.rows = append(out.rows, []driver.Value{[]byte(l.owner), l.expires - l.acquired, int64(1)})
	}
	return out, nil
}

// proof_overflow: args name. Error 1690 on the name's first row, as MySQL's.
func proofOverflow(x *call) (*outcome, error) {
	name, err := x.str(0)
	if err != nil {
		return nil, err
	}
	for _, kind := range []byte("FL") {
		if x.s.read(x.c, x.ref(name, kind)) != nil {
			return nil, errOutOfRange("((`fence` + 1) + 18446744073709551615)")
		}
	}
	return &outcome{}, nil
}

// bigint is BIGINT UNSIGNED's COLUMN_TYPE: MariaDB shows its display
// width, which MySQL dropped in 8.0.
func (s *Server) bigint() string {
	if s.mariadb {
		return "bigint(20) unsigned"
	}
	return "bigint unsigned"
}
