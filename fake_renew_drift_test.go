package sqllock

import (
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/sqllocktest"
)

// renewScript runs renew_many (queries.sql) on db's table as text, bound
// as the shared renewal binds it, on leases the script's acquires took
// under tokens of its own, and returns the answers for
// TestFake_answersAsTheServer: affected rows or error numbers, and each
// lease's state read back, its time left in whole steps (two servers'
// clocks differ by less).
func renewScript(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	ctx := testCtx(t)
	c := driftClient(t, db, table)
	text := c.eng.Forms().SQL
	var out []string
	answer := func(res sql.Result, err error) {
		if err != nil {
			out = append(out, errText(err))
			return
		}
		n, _ := res.RowsAffected()
		out = append(out, fmt.Sprintf("rows %d", n))
	}
	exec := func(q string, args ...any) { answer(db.ExecContext(ctx, q, args...)) }
	const ttl = time.Minute
	acquire := func(name, token string, d time.Duration) {
		us := d.Microseconds()
		exec(text[qAcquire], name, token, "h", us, name, token, "h", token, us)
	}
	// renew is renew_many for d, the names and, for each, its owner.
	renew := func(d time.Duration, names, owners []string) string {
		var in, pairs []string
		for i, n := range names {
			in = append(in, sqltext.Hex(n))
			pairs = append(pairs, sqltext.Hex(owners[i]+n))
		}
		return c.eng.Text().Set("renew_many", strconv.FormatInt(d.Microseconds(), 10), strings.Join(in, ", "), strings.Join(pairs, ", "))
	}
	// by renews the names, each under token.
	by := func(token string, names ...string) string {
		owners := make([]string, len(names))
		for i := range owners {
			owners[i] = token
		}
		return renew(ttl, names, owners)
	}
	inTx := func(q string) { inOwnTx(t, db, func(tx *sql.Tx) { answer(tx.ExecContext(ctx, q)) }) }
	inspect := func(names ...string) {
		var cells []string
		for _, n := range names {
			var (
				live, released sql.NullBool
				left           sql.NullInt64
			)
			err := db.QueryRowContext(ctx, text[qInspect], n).Scan(new(sql.NullString), new(uint64), &live, &left, new(sql.NullInt64), &released)
			switch {
			case err == sql.ErrNoRows:
				cells = append(cells, n+" none")
			case err != nil:
				cells = append(cells, n+" "+errText(err))
			case !left.Valid:
				cells = append(cells, n+" released")
			default:
				step := "-"
				switch d := time.Duration(left.Int64) * time.Microsecond; {
				case d > 5*ttl:
					step = "10m"
				case d > 3*ttl/2:
					step = "2m"
				case d > 0:
					step = "1m"
				}
				cells = append(cells, fmt.Sprintf("%s live %v left %s released form %v", n, live.Bool, step, released.Bool))
			}
		}
		out = append(out, fmt.Sprint(cells))
	}

	a, b := strings.Repeat("0a", 16), strings.Repeat("0b", 16) // tokens: 32 characters
	all := []string{"ours", "other", "expired", "released", "held", "long", "missing"}
	acquire("ours", a, ttl)
	acquire("other", b, ttl)
	acquire("expired", a, time.Microsecond)
	acquire("released", a, ttl)
	exec(text[qRelease], "released", a) // its row deleted
	acquire("held", a, ttl)
	exec(text[qReleaseAtLeast], ttl.Microseconds(), "held", a) // live, the owner a's released form
	acquire("long", a, 10*ttl)
	time.Sleep(time.Millisecond)
	inspect(all...)
	for _, n := range all {
		exec(by(a, n)) // ours and long; long's expiry stays
	}
	inspect(all...)
	exec(by(a, all...))                                              // only the matched rows count
	exec(renew(2*ttl, []string{"other", "other"}, []string{a, b}))   // a name listed twice: matched once
	exec(renew(2*ttl, []string{"long", "ours"}, []string{b, a}))     // pairs in another order
	exec(renew(2*ttl, []string{"ours", "other"}, []string{b, a}))    // each the other's: none
	exec(renew(ttl, []string{"ours"}, []string{strings.ToUpper(a)})) // bytes, not letters: none
	inspect(all...)
	inTx(by(a, "missing"))         // no lease row: the guard is not reached
	inTx(by(a, "other"))           // not a's; MariaDB: the guard, for every row found
	inTx(by(a, "expired"))         // expired; MariaDB: the guard
	inTx(by(a, "missing", "ours")) // MariaDB: the guard
	inspect(all...)                // nothing changed
	return out
}

// TestFake_renewAsTheLibrarySends: renew_many, bound as the shared
// renewal binds it, is a statement the fake of either flavour runs; it
// fails only by MariaDB's session guard, inside a transaction.
func TestFake_renewAsTheLibrarySends(t *testing.T) {
	eachFlavour(t, func(t *testing.T, srv *sqllocktest.Server, mariadb bool) {
		if err := srv.CreateTable("t_renew_sent"); err != nil {
			t.Fatal(err)
		}
		db := srv.DB()
		defer db.Close()
		for i, a := range renewScript(t, db, "t_renew_sent") {
			if strings.HasPrefix(a, "error ") && !(mariadb && a == "error 1690") {
				t.Errorf("step %d: %s", i+1, a)
			}
		}
	})
}
