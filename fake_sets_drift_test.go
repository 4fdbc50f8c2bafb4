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

// setScript runs the set statements (queries.sql, all_*) on db's table as
// a Client sends them, as text, and returns their answers for
// TestFake_answersAsTheServer: refusals by error number, affected rows,
// and all_acquire's insert id 2M + 1 by which fence M it carries, the same
// symbol as M read back by inspect.
func setScript(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	ctx := testCtx(t)
	c := driftClient(t, db, table)
	var fences fenceNames
	sym := fences.name
	var out []string
	answer := func(res sql.Result, err error) {
		if err != nil {
			out = append(out, errText(err))
			return
		}
		id, _ := res.LastInsertId()
		n, _ := res.RowsAffected()
		if id&1 == 1 {
			out = append(out, fmt.Sprintf("id 2*%s+1 rows %d", sym(uint64(id)>>1), n))
			return
		}
		out = append(out, fmt.Sprintf("id %d rows %d", id, n))
	}
	exec := func(q string) { answer(db.ExecContext(ctx, q)) }
	// inTx: the session guard's MariaDB part refuses there what takes or
	// extends a lease (runScript).
	inTx := func(q string) { inOwnTx(t, db, func(tx *sql.Tx) { answer(tx.ExecContext(ctx, q)) }) }
	// inspect: each name's holder, fence and whether its lease is live.
	inspect := func(names ...string) {
		var cells []string
		for _, n := range names {
			var (
				holder sql.NullString
				fence  uint64
				live   sql.NullBool
				left   sql.NullInt64
			)
			err := db.QueryRowContext(ctx, c.eng.Forms().SQL[qInspect], n).Scan(&holder, &fence, &live, &left, new(sql.NullInt64), new(sql.NullBool))
			switch {
			case err == sql.ErrNoRows:
				cells = append(cells, n+" none")
			case err != nil:
				cells = append(cells, n+" "+errText(err))
			default:
				cells = append(cells, fmt.Sprintf("%s %s %s %v", n, holder.String, sym(fence), live.Valid && live.Bool))
			}
		}
		out = append(out, fmt.Sprint(cells))
	}
	const ttl = time.Minute
	set := func(token string, names ...string) *lockSet { return newLockSet(names, token) }
	refresh := func(s *lockSet, d time.Duration) string {
		return c.eng.SetRefresh(s.Set, d)
	}
	atLeast := func(s *lockSet, d time.Duration) string {
		q, _ := c.eng.SetRelease(s.Set, d)
		return q
	}
	check := func(s *lockSet) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		res, err := tx.ExecContext(ctx, c.eng.Text().Set("all_check", s.TokenLit, s.In))
		if err != nil {
			out = append(out, errText(err))
			return
		}
		n, _ := res.RowsAffected()
		out = append(out, fmt.Sprintf("check rows %d", n))
	}

	a := set("A", "s1", "s2", "s3")
	b := set("B", "s0", "s2")
	exec(c.acquireAllSQL(a, ttl))                           // three new names
	inspect("s1", "s2", "s3")                               // one fence, the id's
	exec(c.acquireAllSQL(a, ttl))                           // again, by its owner: a new fence
	inspect("s1", "s2", "s3")                               //
	exec(c.acquireAllSQL(b, ttl))                           // s2 is A's: 1690
	inspect("s0", "s2")                                     // nothing written
	exec(c.eng.Text().Set("all_release", b.TokenLit, b.In)) // nothing of B's
	exec(refresh(b, ttl))                                   // nothing of B's
	exec(refresh(a, ttl))                                   // A's three
	check(a)                                                // A's three, live
	check(b)                                                // not B's
	inTx(c.acquireAllSQL(a, ttl))                           // MariaDB: the guard, always
	inTx(refresh(a, ttl))                                   // MariaDB: the guard
	inTx(refresh(b, ttl))                                   // MariaDB: the guard, for the derived table's NULL row
	inTx(atLeast(b, 0))                                     // nothing of B's; MariaDB: "A" is no base64, 1958
	inTx(atLeast(a, 0))                                     // MariaDB: the guard
	inspect("s1", "s2", "s3")                               // nothing changed
	// B's set behind A's Check: MariaDB's form reports 1205 after its
	// second; MySQL's waits for the transaction, and is refused then.
	behindCheck(t, db, c.eng.Forms().LockWait, c.eng.Text().Set("all_check", a.TokenLit, a.In), nil, func() { exec(c.acquireAllSQL(b, ttl)) })
	inspect("s0", "s2")                                                               // nothing written
	exec(atLeast(a, 0))                                                               // A's three, expired now
	inspect("s1", "s2", "s3")                                                         //
	exec(refresh(a, ttl))                                                             // expired: nothing
	check(a)                                                                          // expired: nothing
	exec(c.acquireAllSQL(b, ttl))                                                     // s2 taken over, s0 new
	inspect("s0", "s1", "s2", "s3")                                                   //
	exec(c.eng.Text().Set("all_release", a.TokenLit, a.In))                           // s1 and s3, still A's
	exec(c.eng.Text().Set("all_release", b.TokenLit, b.In))                           // s0 and s2
	inspect("s0", "s1", "s2", "s3")                                                   // released, fences kept
	exec(c.eng.Text().Set("all_release", a.TokenLit, a.In))                           // nothing left
	exec(c.acquireAllSQL(set("C", "s2"), ttl))                                        // a set of one name
	exec(c.eng.Text().Set("all_release_at_least", "60000000", hexLiteral("C"), b.In)) // s2, listed with s0
	inspect("s2")                                                                     //

	// Fences set ahead, as the fence tests set them (the lease expired).
	setFence := func(name string, fence uint64) {
		answer(db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = IF(kind = 'F', "+fmt.Sprint(fence)+", 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", name))
	}
	exec(c.acquireAllSQL(set("D", "s9"), ttl))
	setFence("s9", 1<<62)
	exec(c.acquireAllSQL(set("E", "s8", "s9"), ttl)) // s8's new fence row written twice
	inspect("s8", "s9")                              // both at s9's fence + 1
	setFence("s9", 1<<63-1)
	exec(c.acquireAllSQL(set("F", "s7", "s9"), ttl)) // 2M past 2^64: 1690
	inspect("s7")                                    // nothing written
	setFence("s9", 1<<64-1)
	exec(c.acquireAllSQL(set("F", "s9"), ttl)) // fence + 1 past 2^64: 1690
	setFence("s9", 1<<63-2)
	exec(c.acquireAllSQL(set("F", "s9"), ttl)) // the greatest fence a set takes
	inspect("s9")
	return out
}

// TestFake_setsAsTheLibrarySends: every set statement a Client sends on
// MySQL or MariaDB is one the fake of that flavour runs, and all_fences,
// which only the one-row forms send, is refused by name.
func TestFake_setsAsTheLibrarySends(t *testing.T) {
	eachFlavour(t, setsAsTheLibrarySends)
}

func setsAsTheLibrarySends(t *testing.T, srv *sqllocktest.Server, mariadb bool) {
	if err := srv.CreateTable("t_sets_sent"); err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	defer db.Close()
	out := setScript(t, db, "t_sets_sent")
	for i, a := range out {
		// MariaDB's refusals: its lock wait bound, and FROM_BASE64.
		if len(a) > 6 && a[:6] == "error " && a != "error 1690" && !(mariadb && (a == "error 1205" || a == "error 1958")) {
			t.Errorf("step %d: %s", i+1, a)
		}
	}
	c, err := New(db, WithTable("t_sets_sent"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newLockSet([]string{"x"}, "A")
	if _, err := db.QueryContext(context.Background(), c.eng.Text().Set("all_fences", s.TokenLit, s.In)); err == nil || !strings.Contains(err.Error(), "all_fences (queries.sql): only a Client on the one-row forms") {
		t.Errorf("all_fences: got %v, want it refused by name: the fake takes the two-row forms", err)
	}
}
