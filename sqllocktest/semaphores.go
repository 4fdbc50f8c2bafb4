package sqllocktest

import (
	"database/sql/driver"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// Counting semaphores: the statements of a semaphore's slots (queries.sql,
// slot_*), each as MySQL runs it. A Client prepares slot_acquire with its
// slot row written once per slot row it visits, v times (the library's
// slotSQL), and on MariaDB with the lock wait bound first, which the fake
// refuses as MySQL does unless it is MariaDB (run); its template holds the row as a
// holeSlotRows, and the statement's x.p.slotRows says how many times it
// came. The slots' own Locks renew, release and check with the lease
// statements (handlers.go): a slot is an ordinary lease row.

// slotRowsMark stands for slot_acquire's slot rows in its template.
const slotRowsMark = "#SLOTROWS#"

// slotRowBounds returns where the slot row, the second row of VALUES, lies
// in slot_acquire's text: where the library finds it to write it v times.
func slotRowBounds(text string) (start, end int) {
	start = strings.Index(text, "(LAST_INSERT_ID(IF(")
	end = start + strings.Index(text[start:], "MICROSECOND),\n") + len("MICROSECOND),\n")
	return start, end
}

// slotRow returns slot_acquire's slot row.
func slotRow(text string) string {
	start, end := slotRowBounds(text)
	return text[start:end]
}

// addSlotAcquire adds slot_acquire's templates with add: MySQL's, and
// MariaDB's, which begins with the lock wait bound.
func addSlotAcquire(qs map[string]string, text string, add func(name, text string, mariadb bool)) {
	start, end := slotRowBounds(text)
	text = text[:start] + slotRowsMark + " " + text[end:]
	add("slot_acquire", text, false)
	add("slot_acquire", qs["lock_wait_mariadb"]+"\n"+text, true)
}

// Where slot_acquire's arguments lie: 3 before the slot rows, 8 for each,
// then P and the 9 of the ON DUPLICATE KEY UPDATE part.
const (
	slotHeadArgs = 3
	slotRowArgs  = 8
)

// slotAcquireRefs returns the rows slot_acquire locks, in its order: the
// fence row, then each slot row it visits. InnoDB locks each row an
// INSERT ... ON DUPLICATE KEY UPDATE finds, changed or not.
func slotAcquireRefs(x *call) []rowRef {
	p, err := x.str(1)
	if err != nil {
		return nil
	}
	refs := []rowRef{x.ref(p, 'F')}
	for k := range x.p.slotRows {
		if name, err := x.str(slotHeadArgs + slotRowArgs*k + 1); err == nil {
			refs = append(refs, x.ref(name, 'L'))
		}
	}
	return refs
}

// slotAcquire: args mode, P, n; then for each slot row i, P i, i, token, i,
// holder, i, ttl µs; then P; then token, n, mode, v, token, holder, ttl µs,
// token, n. Each row is inserted, or updated by the one ON DUPLICATE KEY
// UPDATE part, in order, as MySQL writes a multi-row INSERT, with its
// VALUES evaluated first either way; lid follows LAST_INSERT_ID() through
// the statement. The arguments are read where the statement reads them, so
// that the fake answers what MySQL would to any of them, not only to those
// a Client binds.
func slotAcquire(x *call) (*outcome, error) {
	v := x.p.slotRows
	tail := slotHeadArgs + slotRowArgs*v // P, the third row's
	u, err := slotUpdateArgs(x, tail+1)
	if err != nil {
		return nil, err
	}
	mode, err := x.int(0)
	if err != nil {
		return nil, err
	}
	lid := uint64(mode) // LAST_INSERT_ID(?) * 0
	out := &outcome{}
	// The fence row, first visit: its VALUES record n.
	a, err := x.strs(1, 2)
	if err != nil {
		return nil, err
	}
	if lid, err = u.fenceRow(x, out, a[0], a[1], lid); err != nil {
		return nil, err
	}
	for k := range v {
		if lid, err = u.slotRow(x, out, slotHeadArgs+slotRowArgs*k, lid); err != nil {
			return nil, err
		}
	}
	// The fence row again: its VALUES add 65536 to the mark.
	p, err := x.str(tail)
	if err != nil {
		return nil, err
	}
	if lid > math.MaxUint64-65536 {
		return nil, errOutOfRange("(last_insert_id() + 65536)")
	}
	if lid, err = u.fenceRow(x, out, p, "", lid+65536); err != nil {
		return nil, err
	}
	x.c.lastInsertID = lid
	out.lastID = lid
	return out, nil
}

// slotUpdate holds the arguments of slot_acquire's ON DUPLICATE KEY UPDATE
// part, in the order it takes them.
type slotUpdate struct {
	slotOwner       string // a slot row is free to take when ours
	n               string // the fence row records n
	mode, v         int64
	acquiredOwner   string // acquired_at moves when the slot was not ours
	holder          string
	ttl             int64
	owner, resizeTo string
}

// slotUpdateArgs reads the arguments of the ON DUPLICATE KEY UPDATE part,
// from argument first on.
func slotUpdateArgs(x *call, first int) (*slotUpdate, error) {
	s, err := x.strs(first, first+1, first+4, first+5, first+7, first+8)
	if err != nil {
		return nil, err
	}
	u := &slotUpdate{slotOwner: s[0], n: s[1], acquiredOwner: s[2], holder: s[3], owner: s[4], resizeTo: s[5]}
	for _, f := range []struct {
		i  int
		to *int64
	}{{first + 2, &u.mode}, {first + 3, &u.v}, {first + 6, &u.ttl}} {
		if *f.to, err = x.int(f.i); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// fenceRow writes semaphore p's fence row, whose VALUES carry owner, with
// lid the mark the VALUES left, and returns the mark after it.
func (u *slotUpdate) fenceRow(x *call, out *outcome, p, owner string, lid uint64) (uint64, error) {
	ref := x.ref(p, 'F')
	old := x.s.read(x.c, ref)
	if old == nil {
		x.s.write(x.c, ref, &row{owner: owner, acquired: x.now, expires: x.now})
		out.affected++
		return lid, nil
	}
	r := *old
	switch {
	case lid < 65536:
		// First visit: the mark says whether the semaphore records n, or
		// which other count. The fence is kept.
		if old.owner == u.n {
			lid = uint64(u.mode)
			break
		}
		rec, err := castUnsigned(old.owner)
		if err != nil {
			return 0, err
		}
		if u.v >= 0 && rec <= uint64(u.v) {
			lid = 256
		} else {
			if rec > math.MaxUint64-512 {
				return 0, errOutOfRange("(512 + cast(`" + x.p.table + "`.`owner` as unsigned))")
			}
			lid = 512 + rec
		}
	case lid >= 65536+129 && lid <= 65536+192:
		// A slot was taken: the fence moves on, and the mark becomes the
		// answer, the fence times 128 plus the slot.
		if old.fence == math.MaxUint64 {
			return 0, errOutOfRange("(`" + x.p.table + "`.`fence` + 1)")
		}
		g := max(old.fence+1, uint64(max(x.now, 0)))
		// GREATEST of an unsigned and a signed number is a DECIMAL, which
		// LAST_INSERT_ID() takes as a signed BIGINT.
		slot := lid - 65536 - 128
		if g > (math.MaxInt64-slot)/128 {
			v := new(big.Int).SetUint64(g)
			v.Mul(v, big.NewInt(128)).Add(v, new(big.Int).SetUint64(slot))
			if x.s.mariadb {
				return 0, errOverflow(v.String())
			}
			return 0, errTruncated("DECIMAL", v.String())
		}
		lid = g*128 + slot
		r.fence = g
	default:
		var rec uint64
		if lid-65536 == 384 {
			var err error
			if rec, err = castUnsigned(old.owner); err != nil {
				return 0, err
			}
		}
		switch lid - 65536 {
		case 128:
			lid = 0 // all held
		case 256:
			lid = 1 // no slot live: resized
		case 384:
			lid = 1000 + rec
		default:
			lid = 2000 + lid - 65536 - 512
		}
	}
	if lid == 1 {
		r.owner = u.resizeTo
	}
	if x.s.write(x.c, ref, &r) {
		out.affected += 2
	}
	return lid, nil
}

// slotRow writes the slot row whose arguments begin at arg, with lid the
// mark the rows before it left, and returns the mark after it.
func (u *slotUpdate) slotRow(x *call, out *outcome, arg int, lid uint64) (uint64, error) {
	is := make([]uint64, 4) // the four i's the row binds
	for j, at := range []int{0, 2, 4, 6} {
		i, err := x.int(arg + at)
		if err != nil {
			return 0, err
		}
		is[j] = 128 + uint64(i)
	}
	a, err := x.strs(arg+1, arg+3, arg+5)
	if err != nil {
		return 0, err
	}
	name, token, holder := a[0], a[1], a[2]
	ttl, err := x.int(arg + 7)
	if err != nil {
		return 0, err
	}
	// VALUES: the mark 128 takes slot i tentatively.
	if lid == 128 {
		lid = is[0]
	}
	nr := &row{acquired: x.now}
	if lid == is[1] {
		nr.owner = token
	}
	if lid == is[2] {
		nr.holder = holder
	}
	if lid != is[3] {
		ttl = 0
	}
	if nr.expires, err = plus(x.now, ttl, "expires_at"); err != nil {
		return 0, err
	}
	ref := x.ref(name, 'L')
	old := x.s.read(x.c, ref)
	if old == nil {
		x.s.write(x.c, ref, nr)
		out.affected++
		return lid, nil
	}
	// The update: the slot's number comes from the row's name.
	slot, err := castUnsigned(right(name, 2))
	if err != nil {
		return 0, err
	}
	live := old.owner != "" && old.expires > x.now
	switch {
	case lid == 128+slot:
		if old.owner != "" && old.owner != u.slotOwner && old.expires > x.now {
			lid = 128 // held by another: not taken
		}
	case lid == 256 && live:
		lid = 384
	}
	r := *old
	r.fence = 0
	if lid == 128+slot {
		if old.owner != u.acquiredOwner {
			r.acquired = x.now
		}
		r.holder = u.holder
		e, err := plus(x.now, u.ttl, "expires_at")
		if err != nil {
			return 0, err
		}
		r.expires = max(old.expires, e) // GREATEST: never earlier
		r.owner = u.owner
	}
	if x.s.write(x.c, ref, &r) {
		out.affected += 2
	}
	return lid, nil
}

// right is RIGHT(s, n).
func right(s string, n int) string { return s[max(len(s)-n, 0):] }

// castUnsigned is CAST(s AS UNSIGNED) in a statement that writes, in
// MySQL's default strict sql_mode: a string that is not all digits
// fails it.
func castUnsigned(s string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, errTruncated("INTEGER", s)
	}
	return v, nil
}

// slotBounds reads the arguments P and Q of slot_release and slot_list:
// the rows of semaphore P lie in [P, Q).
func slotBounds(x *call) (p, q string, err error) {
	a, err := x.strs(0, 1)
	if err != nil {
		return "", "", err
	}
	return a[0], a[1], nil
}

// slotRange returns the keys c sees whose names lie from p on (with
// from, else after it) and below q, in name and kind order.
func slotRange(x *call, p, q string, from bool) []rowKey {
	var keys []rowKey
	for _, k := range x.s.keys(x.c, x.p.table) {
		if (k.name > p || from && k.name == p) && k.name < q {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].name != keys[j].name {
			return keys[i].name < keys[j].name
		}
		return keys[i].kind < keys[j].kind
	})
	return keys
}

// slotReleaseRefs returns the rows slot_release scans, which InnoDB locks:
// every row of the range.
func slotReleaseRefs(x *call) []rowRef {
	p, q, err := slotBounds(x)
	if err != nil {
		return nil
	}
	var refs []rowRef
	for _, k := range slotRange(x, p, q, false) {
		refs = append(refs, rowRef{x.p.table, k})
	}
	return refs
}

// slotRelease: args P, Q, token. A DELETE: the affected rows count the
// token's lease rows deleted.
func slotRelease(x *call) (*outcome, error) {
	p, q, err := slotBounds(x)
	if err != nil {
		return nil, err
	}
	token, err := x.str(2)
	if err != nil {
		return nil, err
	}
	out := &outcome{}
	for _, k := range slotRange(x, p, q, false) {
		ref := rowRef{x.p.table, k}
		if r := x.s.read(x.c, ref); k.kind == 'L' && r != nil && r.owner == token {
			x.s.write(x.c, ref, nil)
			out.affected++
		}
	}
	return out, nil
}

// slotList: args P, Q. Every row of the range, in name and kind order.
func slotList(x *call) (*outcome, error) {
	p, q, err := slotBounds(x)
	if err != nil {
		return nil, err
	}
	out := &outcome{cols: []string{"name", "kind", "owner_or_holder", "fence", "held", "left_us"}}
	for _, k := range slotRange(x, p, q, true) {
		r := x.s.read(x.c, rowRef{x.p.table, k})
		if r == nil {
			continue
		}
		text := r.holder
		if k.kind == 'F' {
			text = r.owner
		}
		out.rows = append(out.rows, []driver.Value{[]byte(k.name), []byte{k.kind}, []byte(text),
			fenceValue(r.fence), boolValue(r.owner != "" && r.expires > x.now), r.expires - x.now})
	}
	return out, nil
}
