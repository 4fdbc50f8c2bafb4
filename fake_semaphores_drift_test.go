package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/sqllocktest"
)

// semaphoreScript runs the semaphore statements (queries.sql, slot_*) on
// db's table as a Client sends them, slot_acquire in the form its server
// takes (MariaDB's with the lock wait bound) for each number of slot rows
// it visits, and returns their answers for TestFake_answersAsTheServer:
// slot_acquire's insert id (a fence, by which one it is, and the slot; 0;
// 1; 1000 + r; 2000 + r), affected rows, the rows of slot_list, errors by
// number, and the slots' Locks' renewals and releases, which are the lease
// statements on a slot's row.
func semaphoreScript(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	ctx := testCtx(t)
	c := driftClient(t, db, table)
	f := c.eng.Forms()
	var fences fenceNames
	sym := fences.name
	var out []string
	answer := func(res sql.Result, err error) {
		if err != nil {
			out = append(out, errText(err))
			return
		}
		id64, _ := res.LastInsertId()
		n, _ := res.RowsAffected()
		if id := uint64(id64); id >= slotTaken {
			out = append(out, fmt.Sprintf("fence %s slot %d rows %d", sym(id/128), id%128, n))
			return
		}
		out = append(out, fmt.Sprintf("id %d rows %d", id64, n))
	}
	const sem, ttl = "s", time.Minute
	p, q := slotRows(sem), slotRowsEnd(sem)
	// take sends slot_acquire for a semaphore of n slots, visiting v slot
	// rows, under token.
	takeOn := func(on execer, token string, n, v int) {
		s := &slotCall{acquireCall: acquireCall{c: c, name: p, ttl: ttl, token: token}, sem: sem, n: n}
		answer(on.ExecContext(ctx, slotSQL(c.eng.Forms().Table, f.LockWait, v), s.args(v)...))
	}
	take := func(token string, n, v int) { takeOn(db, token, n, v) }
	list := func() {
		rows, err := db.QueryContext(ctx, c.eng.Text().Substitute(queries["slot_list"]), p, q)
		if err != nil {
			out = append(out, errText(err))
			return
		}
		defer rows.Close()
		var cells []string
		for rows.Next() {
			var (
				name, kind, text string
				fence            uint64
				held             bool
				left             int64
			)
			if err := rows.Scan(&name, &kind, &text, &fence, &held, &left); err != nil {
				t.Fatal(err)
			}
			sign := "+"
			if left <= 0 {
				sign = "-"
			}
			cells = append(cells, fmt.Sprintf("%q %s %q %s %v %s", strings.TrimPrefix(name, p), kind, text, sym(fence), held, sign))
		}
		if err := rows.Err(); err != nil {
			out = append(out, errText(err))
			return
		}
		out = append(out, "rows ["+strings.Join(cells, "; ")+"]")
	}
	slot := func(i int) string { return slotName(sem, i) }
	release := func(token string) {
		answer(db.ExecContext(ctx, c.eng.Text().Substitute(queries["slot_release"]), p, q, token))
	}
	us := ttl.Microseconds()
	lock := func(name, token string) { // a lock whose name lies among the semaphore's rows: its fence
		res, err := db.ExecContext(ctx, f.SQL[qAcquire], name, token, "drift", us, name, token, "drift", token, us)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := res.LastInsertId()
		out = append(out, "lock fence "+sym(uint64(id)))
	}
	// Fences set ahead, as the fence tests set them.
	setFence := func(fence uint64) {
		answer(db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = IF(kind = 'F', "+fmt.Sprint(fence)+", 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", p))
	}

	atLeast := func(i int, token string) { // the lease on slot i ends now
		answer(db.ExecContext(ctx, f.SQL[qReleaseAtLeast], int64(0), slot(i), token))
	}

	take("A", 3, 3)                                                // a new semaphore of 3: slot 1
	take("A", 3, 3)                                                // the same token again: slot 1, a new fence
	take("B", 3, 3)                                                // slot 2
	take("C", 3, 3)                                                // slot 3
	take("D", 3, 3)                                                // all held: 0
	inOwnTx(t, db, func(tx *sql.Tx) { takeOn(tx, "D", 3, 3) })     // MariaDB: the guard, always
	list()                                                         //
	take("D", 2, 2)                                                // 3 slots, more than 2 visits: 2000 + 3
	take("D", 2, 3)                                                // the wider visit: one held, 1000 + 3
	take("D", 4, 4)                                                // 3 slots, one held: 1000 + 3
	take("D", 64, 64)                                              // the most slot rows: 1000 + 3
	answer(db.ExecContext(ctx, f.SQL[qRefresh], us, slot(2), "B")) // B renews its slot
	answer(db.ExecContext(ctx, f.SQL[qRefresh], us, slot(2), "A")) // not A's
	checkIn(ctx, t, db, f.SQL[qCheck], &out, slot(2), "B")         // B's and live
	// A take behind B's Check of slot 2: MariaDB's form reports 1205 after
	// its second; MySQL's waits for the transaction, and is refused then.
	behindCheck(t, db, f.LockWait, f.SQL[qCheck], []any{slot(2), "B"}, func() { take("D", 3, 3) })
	answer(db.ExecContext(ctx, f.SQL[qRelease], slot(1), "A"))                               // A gives slot 1 back
	take("E", 3, 3)                                                                          // slot 1 again
	atLeast(3, "C")                                                                          //
	take("F", 3, 3)                                                                          // slot 3, expired: taken over
	answer(db.ExecContext(ctx, f.SQL[qRefresh], us, slot(3), "C"))                           // C lost it
	list()                                                                                   //
	release("E")                                                                             // slot 1
	release("E")                                                                             // nothing left of E's
	release("B")                                                                             // slot 2
	release("F")                                                                             // slot 3
	lock(p+"zz", "L")                                                                        // a lock among the semaphore's rows
	list()                                                                                   //
	take("H", 2, 2)                                                                          // all free, 3 recorded: 2000 + 3
	take("H", 2, 3)                                                                          // the wider visit: resized to 2, 1
	take("H", 2, 2)                                                                          // slot 1 of 2
	take("I", 5, 5)                                                                          // one held: 1000 + 2
	release("H")                                                                             //
	take("I", 5, 5)                                                                          // all free: resized to 5, 1
	take("I", 5, 5)                                                                          // slot 1 of 5
	atLeast(1, "I")                                                                          //
	take("J", 5, 5)                                                                          // slot 1, expired: taken over
	list()                                                                                   //
	release("L")                                                                             // the lock's lease row is in the range too
	setFence(1<<56 - 2)                                                                      //
	take("K", 5, 5)                                                                          // the greatest fence a slot takes
	setFence(1<<56 - 1)                                                                      //
	take("K", 5, 5)                                                                          // its answer past 2^63: 1292
	setFence(1<<64 - 1)                                                                      //
	take("K", 5, 5)                                                                          // fence + 1 past 2^64: 1690
	list()                                                                                   // nothing written
	answer(db.ExecContext(ctx, c.eng.Text().Substitute(queries["slot_release"]), q, p, "K")) // an empty range
	return out
}

// TestFake_semaphoresAsTheLibrarySends: every semaphore statement a Client
// sends on MySQL or MariaDB is one the fake of that flavour runs, for every
// number of slot rows, and MariaDB's form is refused by the MySQL flavour
// as MySQL refuses it (a syntax error).
func TestFake_semaphoresAsTheLibrarySends(t *testing.T) {
	eachFlavour(t, semaphoresAsTheLibrarySends)
}

func semaphoresAsTheLibrarySends(t *testing.T, srv *sqllocktest.Server, mariadb bool) {
	if err := srv.CreateTable("t_slots_sent"); err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	defer db.Close()
	overflow := "error 1292" // a fence past a BIGINT in LAST_INSERT_ID()
	if mariadb {
		overflow = "error 1916"
	}
	for i, a := range semaphoreScript(t, db, "t_slots_sent") {
		if strings.HasPrefix(a, "error ") && a != overflow && a != "error 1690" && !(mariadb && a == "error 1205") {
			t.Errorf("step %d: %s", i+1, a)
		}
	}
	c := driftClient(t, db, "t_slots_sent")
	ctx := context.Background()
	for v := 1; v <= MaxSlots; v++ {
		s := &slotCall{acquireCall: acquireCall{c: c, name: slotRows("v"), ttl: time.Minute, token: "T"}, sem: "v", n: v}
		if _, err := db.ExecContext(ctx, slotSQL(c.eng.Forms().Table, mariadb, v), s.args(v)...); err != nil {
			t.Errorf("v=%d: %v", v, err)
		}
	}
	if mariadb {
		return
	}
	s := &slotCall{acquireCall: acquireCall{c: c, name: slotRows("m"), ttl: time.Minute, token: "T"}, sem: "m", n: 2}
	_, err := db.ExecContext(ctx, slotSQL(c.eng.Forms().Table, true, 2), s.args(2)...)
	if errText(err) != "error 1064" {
		t.Errorf("MariaDB's form: got %v, want error 1064, as MySQL answers it", err)
	}
}
