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

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// renewScript runs renew_many and renew_found (queries.sql) on db's table
// as text, bound as the shared renewal binds them, on leases the script's
// acquires took under tokens of its own, and returns the answers for
// TestFake_answersAsTheServer: affected rows or error numbers, the pairs
// found, and each lease's state read back, its time left in whole steps
// (two servers' clocks differ by less).
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
	// renew is renew_many for d, the names and, for each, its owner, as
	// the Client sends it to this server.
	renew := func(d time.Duration, names, owners []string) string {
		return c.eng.RenewMany(d, renewLits(names, owners))
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
	a, b := strings.Repeat("0a", 16), strings.Repeat("0b", 16) // tokens: 32 characters
	// foundOn runs renew_found on the names, each with its owner, within
	// five seconds (it waits for no lock), and answers its column and
	// rows, each as its owner's letter and its name.
	foundOn := func(on querier, names, owners []string) {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		rows, err := on.QueryContext(qctx, c.eng.RenewFoundText(renewLits(names, owners)))
		if err != nil {
			out = append(out, errText(err))
			return
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		var cells []string
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			switch {
			case strings.HasPrefix(v, a):
				v = "a " + v[len(a):]
			case strings.HasPrefix(v, b):
				v = "b " + v[len(b):]
			}
			cells = append(cells, v)
		}
		if err := rows.Err(); err != nil {
			out = append(out, errText(err))
			return
		}
		out = append(out, fmt.Sprintf("%q found %q", cols, cells))
	}
	found := func(names, owners []string) { foundOn(db, names, owners) }
	// foundBy is renew_found of the names, each under token.
	foundBy := func(token string, names ...string) {
		owners := make([]string, len(names))
		for i := range owners {
			owners[i] = token
		}
		found(names, owners)
	}
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
	// renew_found: only a pair whose lease is its owner's and live.
	for _, n := range all {
		foundBy(a, n) // ours and long
	}
	foundBy(b, "other")                                         // b's
	found([]string{"other", "other"}, []string{a, b})           // a name listed twice: once
	found([]string{"ours", "other"}, []string{b, a})            // each the other's: none
	found([]string{"ours"}, []string{strings.ToUpper(a)})       // bytes, not letters: none
	found([]string{"ours", "long", "other"}, []string{a, a, b}) // several
	for _, n := range all {
		exec(by(a, n)) // ours and long; long's expiry stays
	}
	inspect(all...)
	exec(by(a, all...))                                              // only the matched rows count
	foundBy(a, all...)                                               // what that renew_many extended
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
	// Beside a Check's transaction that then deleted the lease, uncommitted:
	// renew_found waits for none and reads the committed row; in that
	// transaction, its own write.
	inOwnTx(t, db, func(tx *sql.Tx) {
		answer(tx.ExecContext(ctx, text[qCheck], "ours", a))
		answer(tx.ExecContext(ctx, text[qRelease], "ours", a))
		foundBy(a, "ours")
		foundOn(tx, []string{"ours"}, []string{a})
	})
	foundBy(a, "ours") // rolled back
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
