package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/sqllocktest"
)

// TestFake_answersAsTheServer sends one script of statements, as the library
// sends them, to each real server and to the fake, and holds the fake's
// every answer (insert id, affected rows, rows, error number) against the
// server's: the library's tests read only the answers they decide by, and
// this reads them all; the set statements, sent as text, are compared
// too (setScript), the semaphore statements (semaphoreScript), and the
// shared renewal's (renewScript). Fences and times differ between two
// clocks, so a fence is compared by which one it is (the first seen, the
// second), and a time left by its sign. A MariaDB server is compared with the fake made
// WithMariaDB, a MySQL server with the fake as it is by default: each
// Client takes its server's forms, and the scripts send them.
func TestFake_answersAsTheServer(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.Fake || e.server.TiDB || e.server.Vitess {
			// TiDB and Vitess take other statements (the one-row forms),
			// whose answers the fake, which poses as MySQL or MariaDB,
			// does not give.
			t.Skip("compares a MySQL or MariaDB server with the fake")
		}
		var opts []sqllocktest.Option
		if e.server.MariaDB {
			opts = append(opts, sqllocktest.WithMariaDB())
		}
		srv, err := sqllocktest.NewServer(opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		fakeDB := srv.DB()
		defer fakeDB.Close()
		real := runScript(t, e.db, e.newTable(t))
		if err := srv.CreateTable("t_drift"); err != nil {
			t.Fatal(err)
		}
		fake := runScript(t, fakeDB, "t_drift")
		real = append(real, wakeScript(t, e.db, "t_wake")...)
		fake = append(fake, wakeScript(t, fakeDB, "t_wake")...)
		if err := srv.CreateTable("t_sets"); err != nil {
			t.Fatal(err)
		}
		real = append(real, setScript(t, e.db, e.newTable(t))...)
		fake = append(fake, setScript(t, fakeDB, "t_sets")...)
		if err := srv.CreateTable("t_slots"); err != nil {
			t.Fatal(err)
		}
		real = append(real, semaphoreScript(t, e.db, e.newTable(t))...)
		fake = append(fake, semaphoreScript(t, fakeDB, "t_slots")...)
		if err := srv.CreateTable("t_renew"); err != nil {
			t.Fatal(err)
		}
		real = append(real, renewScript(t, e.db, e.newTable(t))...)
		fake = append(fake, renewScript(t, fakeDB, "t_renew")...)
		// The table as information_schema shows it: MySQL's column types
		// read differently from MariaDB's.
		real = append(real, tableRows(t, e.db, strings.Trim(e.newTable(t), "`"))...)
		fake = append(fake, tableRows(t, fakeDB, "sqllock")...)
		for i := range max(len(real), len(fake)) {
			var r, f string
			if i < len(real) {
				r = real[i]
			}
			if i < len(fake) {
				f = fake[i]
			}
			if r != f {
				t.Errorf("step %d: fake answered %q, %s %q", i+1, f, e.server.Label, r)
			}
		}
	})
}

// runScript runs the script on db's table and returns its answers, in a
// form two servers' clocks do not change.
func runScript(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	ctx := testCtx(t)
	c, err := New(db, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.List(ctx); err != nil { // the first-use check chooses the forms
		t.Fatal(err)
	}
	c.mu.Lock()
	text := c.eng.Forms().SQL
	c.mu.Unlock()
	var fences []int64
	sym := func(v int64) string { // a fence, by which one it is
		if v <= 2 {
			return fmt.Sprint(v)
		}
		if i := slices.Index(fences, v); i >= 0 {
			return fmt.Sprintf("F%d", i+1)
		}
		fences = append(fences, v)
		return fmt.Sprintf("F%d", len(fences))
	}
	// MariaDB's forms: the fake's VERSION() chose them as the server's did.
	out := []string{fmt.Sprintf("MariaDB's forms %v", c.eng.Forms().LockWait)}
	execOn := func(on execer, q string, args ...any) {
		res, err := on.ExecContext(ctx, q, args...)
		if err != nil {
			out = append(out, errText(err))
			return
		}
		id, _ := res.LastInsertId()
		n, _ := res.RowsAffected()
		out = append(out, fmt.Sprintf("id %s rows %d", sym(id), n))
	}
	exec := func(q string, args ...any) { execOn(db, q, args...) }
	// inTx sends q inside a transaction, rolled back: the session guard's
	// MariaDB part (@@in_transaction) refuses there what takes or extends
	// a lease, once the server evaluates it.
	inTx := func(q string, args ...any) {
		inOwnTx(t, db, func(tx *sql.Tx) { execOn(tx, q, args...) })
	}
	query := func(q string, args ...any) {
		rows, err := db.QueryContext(ctx, q, args...)
		if err != nil {
			out = append(out, errText(err))
			return
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		var all []string
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var cells []string
			for _, v := range vals {
				cells = append(cells, cell(v, sym))
			}
			all = append(all, strings.Join(cells, ","))
		}
		out = append(out, "rows ["+strings.Join(all, "; ")+"]")
	}
	const n, min = "drift", int64(60_000_000)
	acquireArgs := func(tok, holder string) []any { return []any{n, tok, holder, min, n, tok, holder, tok, min} }
	acquire := func(tok, holder string) { exec(text[qAcquire], acquireArgs(tok, holder)...) }
	inspect := func() { query(text[qInspect], n) }
	delay := func(us any, owner, tok string) { exec(text[qLockDelay], us, owner, "hd", n, tok) }

	acquire("A", "ha")                              // takes a new name
	acquire("A", "ha")                              // again, by its owner
	acquire("B", "hb")                              // refused
	exec(text[qRefresh], min, n, "B")               // not B's
	exec(text[qRefresh], min, n, "A")               // A's
	inspect()                                       // A holds it
	inTx(text[qAcquire], acquireArgs("A", "ha")...) // MariaDB: the guard, always
	inTx(text[qAcquire], acquireArgs("B", "hb")...) //
	inTx(text[qRefresh], min, n, "B")               // not B's: the guard is not reached
	inTx(text[qRefresh], min, n, "A")               // MariaDB: the guard
	inTx(text[qReleaseAtLeast], min, n, "B")        // not B's; MariaDB: "A" is no base64, 1958
	inTx(text[qReleaseAtLeast], min, n, "A")        // MariaDB: the guard
	inTx(text[qLockDelay], nil, "d", "hd", n, "B")  // not B's
	inTx(text[qLockDelay], nil, "d", "hd", n, "A")  // MariaDB: the guard
	inspect()                                       // nothing changed
	exec(text[qReleaseAtLeast], int64(0), n, "A")   // expires it now
	inspect()                                       // expired
	inTx(text[qRefresh], min, n, "A")               // A's, expired: MariaDB's guard comes first
	acquire("B", "hb")                              // takes it over
	exec(text[qRefresh], min, n, "A")               // A lost it
	exec(text[qOnceRecord], n, "A")                 // not A's
	exec(text[qOnceRecord], n, "B")                 // records
	exec(text[qOnceRecord], n, "B")                 // duplicate: 1062
	query(text[qOnceDone], n)                       // the record
	query(text[qLease], n)                          // B's
	query(text[qList])                              // B's
	exec(text[qOnceReset], n)                       // deleted
	exec(text[qOnceReset], n)                       // nothing
	checkIn(ctx, t, db, text[qCheck], &out, n, "B") // B's and live
	// An acquire behind B's Check: MariaDB's form reports 1205 after its
	// second; MySQL's waits for the transaction, and is refused then.
	behindCheck(t, db, c.eng.Forms().LockWait, text[qCheck], []any{n, "B"}, func() { acquire("D", "hd") })
	inspect()                                       // nothing changed
	checkIn(ctx, t, db, text[qCheck], &out, n, "A") // not A's
	exec(text[qRelease], n, "A")                    // not A's
	exec(text[qRelease], n, "B")                    // B's
	inspect()                                       // released, fence kept
	query(text[qLease], n)                          // nothing
	acquire("C", "hc")                              // the fence goes on
	delay(nil, "lock-delay/1", "A")                 // not A's
	delay(nil, "lock-delay/1", "C")                 // C's: the default delay
	exec(text[qReleaseAtLeast], min, n, "C")        // not C's; MariaDB: no base64 in the lock-delay's owner, 1958
	inspect()                                       // held by the lock-delay, fence kept
	acquire("E", "he")                              // refused
	delay(int64(2), "lock-delay/2", "C")            // not C's any more
	delay(int64(2), "lock-delay/2", "lock-delay/1") // shortened to 2 µs
	time.Sleep(time.Millisecond)
	acquire("E", "he")                                       // takes it over, the fence goes on
	exec(text[qReleaseAtLeast], int64(60_000_000), n, "E")   // released with a minimum hold
	delay(int64(0), "lock-delay/3", "E")                     // none: ends now
	inspect()                                                // expired
	exec(c.eng.Text().Substitute(queries["proof_clear"]), n) // every row of the name
	inspect()                                                // nothing
	exec(text[qRelease], "never", "A")                       // a name never taken
	exec(text[qRefresh], int64(-1), n+"x", "A")              // nothing to refresh

	// A semaphore's slot row has its semaphore's fence in list and lease;
	// rows made here by acquire, whose fence row shares the lease's name.
	p, slot, odd := "s"+slotMark, "s"+slotMark+"01", "s"+slotMark+"x1"
	for _, name := range []string{p, slot, odd} {
		exec(text[qAcquire], name, "S", "hs", min, name, "S", "hs", "S", min)
	}
	query(text[qLease], slot) // p's fence, not its own
	query(text[qLease], odd)  // no slot: its own
	query(text[qList])
	for _, name := range []string{p, slot, odd} {
		exec(c.eng.Text().Substitute(queries["proof_clear"]), name)
	}
	return out
}

// driftClient returns a Client on db's table whose first use has chosen the
// forms of its statements, for a script to send them as it would.
func driftClient(t *testing.T, db *sql.DB, table string) *Client {
	t.Helper()
	c, err := New(db, WithTable(table), WithHolder("drift"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.List(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return c
}

// fenceNames names fences by which one they are, F1 on in the order first
// seen, as two servers' clocks seed them differently; 0 to 2, and those
// from 2^55 on (set ahead by the script, the same everywhere), as they are.
type fenceNames []uint64

func (f *fenceNames) name(v uint64) string {
	if v <= 2 || v >= 1<<55 {
		return fmt.Sprint(v)
	}
	i := slices.Index(*f, v)
	if i < 0 {
		*f = append(*f, v)
		i = len(*f) - 1
	}
	return fmt.Sprintf("F%d", i+1)
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// inOwnTx runs f in a transaction on db, rolled back after.
func inOwnTx(t *testing.T, db *sql.DB, f func(tx *sql.Tx)) {
	t.Helper()
	tx, err := db.BeginTx(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	f(tx)
}

// behindCheck runs take, which must wait for a row that check (sent with
// args in a transaction of its own) locks, and returns once take has
// answered. With MariaDB's forms (lockWait) take ends by itself: its
// acquire waits a second at most, and the transaction ends after that.
// Otherwise the transaction ends after two seconds, or at take's answer
// if it comes first, which MySQL's never does (it waits
// innodb_lock_wait_timeout, 50 s): a wait that ended early shows as
// another answer.
func behindCheck(t *testing.T, db *sql.DB, lockWait bool, check string, args []any, take func()) {
	t.Helper()
	ctx := testCtx(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if res, err := tx.ExecContext(ctx, check, args...); err != nil {
		t.Fatal(err)
	} else if n, _ := res.RowsAffected(); n == 0 {
		t.Fatalf("the check locked no lease: %v", args)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		take()
	}()
	if !lockWait {
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
		_ = tx.Rollback()
	}
	<-done
}

// checkIn runs check in a transaction of its own, rolled back.
func checkIn(ctx context.Context, t *testing.T, db *sql.DB, q string, out *[]string, args ...any) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		*out = append(*out, errText(err))
		return
	}
	n, _ := res.RowsAffected()
	*out = append(*out, fmt.Sprintf("check rows %d", n))
}

func errText(err error) string {
	if n, ok := fault.Errno(err); ok {
		return fmt.Sprintf("error %d", n)
	}
	return "error " + err.Error()
}

// cell writes a value so that two servers' clocks give the same text: a
// fence (seeded from the clock in microseconds) by which one it is, a time
// left (under a day here) by its sign.
func cell(v sql.NullString, sym func(int64) string) string {
	if !v.Valid {
		return "NULL"
	}
	i, err := strconv.ParseInt(v.String, 10, 64)
	switch {
	case err != nil || i >= 0 && i <= 2:
		return v.String
	case i < 0:
		return "-"
	case i < 86_400_000_000:
		return "+"
	}
	return sym(i)
}

// wakeScript runs the wake-up statements on two connections of db, as two
// processes would, and returns their answers, a connection id as "id".
func wakeScript(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	ctx := testCtx(t)
	one, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	two, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close()
	text := func(name string, lits ...string) string {
		return bind(strings.ReplaceAll(queries[name], "'sqllock'", "'"+table+"'"), lits...)
	}
	lit := hexLiteral(fmt.Sprintf("drift %p", db)) // a channel of this run's own
	var out []string
	ask := func(conn *sql.Conn, q string, n int) {
		isID := strings.HasPrefix(q, "SELECT IS_USED_LOCK")
		vals := make([]sql.NullInt64, n)
		ptrs := make([]any, n)
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := conn.QueryRowContext(ctx, q).Scan(ptrs...); err != nil {
			out = append(out, errText(err))
			return
		}
		var cells []string
		for _, v := range vals {
			switch {
			case !v.Valid:
				cells = append(cells, "NULL")
			case isID:
				cells = append(cells, "id")
			default:
				cells = append(cells, fmt.Sprint(v.Int64))
			}
		}
		out = append(out, strings.Join(cells, ","))
	}
	ask(one, text("wake_probe", lit), 1)                  // nobody holds it
	ask(one, text("wake_wait", lit, lit, "0"), 2)         // free; taken
	ask(one, text("wake_wait", lit, lit, "0"), 2)         // taken again, by its holder
	ask(two, text("wake_wait", lit, lit, "0"), 2)         // held; timed out
	ask(two, text("wake_probe", lit), 1)                  // its holder's id
	ask(two, text("wake_release", lit), 1)                // not two's
	ask(one, text("wake_release", lit), 1)                // once
	ask(one, text("wake_release", lit), 1)                // twice: free now
	ask(one, text("wake_release", lit), 1)                // nobody's
	ask(two, text("wake_wait", lit, lit, "0"), 2)         // free; taken
	two.Raw(func(any) error { return driver.ErrBadConn }) // two's connection ends
	// A server frees a closed connection's locks a moment later.
	waitFor(t, 5*time.Second, "the channel freed", func() bool {
		var id sql.NullInt64
		return one.QueryRowContext(ctx, text("wake_probe", lit)).Scan(&id) == nil && !id.Valid
	})
	ask(one, text("wake_wait", lit, lit, "0"), 2) // freed with its connection
	ask(one, text("wake_release", lit), 1)
	return out
}

// tableRows returns first_use's rows about table, but the server's.
func tableRows(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.QueryContext(testCtx(t), firstUseSQL(table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var f [7]sql.NullString
		if err := rows.Scan(&f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6]); err != nil {
			t.Fatal(err)
		}
		if f[0].String == "server" {
			continue
		}
		f[1].String = "TABLE" // the name differs, the rest must not
		out = append(out, fmt.Sprint(f))
	}
	slices.Sort(out)
	return out
}

// The fake's copies of queries.sql and schema.sql must hold the library's
// statements, word for word: a statement changed in one and not in the
// other fails here, so that the fake never runs a statement other than the
// one the library sends.
func TestFake_statementsAsTheLibrarys(t *testing.T) {
	for _, f := range []struct{ copy, original string }{
		{"sqllocktest/queries.sql", queriesSQL},
		{"sqllocktest/schema.sql", "-- name: schema\n" + schemaSQL},
	} {
		b, err := os.ReadFile(f.copy)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if strings.HasSuffix(f.copy, "schema.sql") {
			text = "-- name: schema\n" + text
		}
		got, err := splitQueries(text)
		if err != nil {
			t.Fatalf("%s: %v", f.copy, err)
		}
		want := sqltext.MustSplit(f.original)
		for _, name := range slices.Sorted(maps.Keys(want)) {
			if strings.Join(strings.Fields(got[name]), " ") != strings.Join(strings.Fields(want[name]), " ") {
				t.Errorf("%s: statement %q differs from the library's: copy the file there and make the fake (sqllocktest/handlers.go) run it as a server does", f.copy, name)
			}
		}
		for name := range got {
			if _, ok := want[name]; !ok {
				t.Errorf("%s: statement %q is not the library's any more: copy the file there", f.copy, name)
			}
		}
	}
}

// eachFlavour runs f on a fake server of each flavour: MySQL's, and
// MariaDB's (mariadb true).
func eachFlavour(t *testing.T, f func(t *testing.T, srv *sqllocktest.Server, mariadb bool)) {
	for _, mariadb := range []bool{false, true} {
		name, opts := "mysql", []sqllocktest.Option(nil)
		if mariadb {
			name, opts = "mariadb", append(opts, sqllocktest.WithMariaDB())
		}
		t.Run(name, func(t *testing.T) {
			srv, err := sqllocktest.NewServer(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			f(t, srv, mariadb)
		})
	}
}

// Every statement a Client sends, as it sends it, is one the fake runs:
// prepared with a table's name in place, or as text with its literals; on
// either flavour, in the forms a Client chooses for it.
func TestFake_runsEveryStatement(t *testing.T) {
	eachFlavour(t, runsEveryStatement)
}

func runsEveryStatement(t *testing.T, srv *sqllocktest.Server, mariadb bool) {
	if err := srv.CreateTable("t_fake"); err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	defer db.Close()
	c, err := New(db, WithTable("t_fake"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	texts := map[string]string{
		"first_use": firstUseSQL("t_fake"),
		"schema":    c.eng.Text().Substitute(schema),
	}
	if _, err := c.List(ctx); err != nil { // the first use chooses the forms
		t.Fatal(err)
	}
	if got := c.eng.Forms().LockWait; got != mariadb {
		t.Fatalf("the Client took MariaDB's forms: got %v, want %v", got, mariadb)
	}
	for i, text := range c.eng.Forms().SQL {
		texts[stmtNames[i]] = text
	}
	texts["all_acquire"] = c.acquireAllSQL(newLockSet([]string{"x", "y"}, "A"), time.Minute)
	for _, name := range []string{"proof_clear", "slot_release", "slot_list"} {
		texts[name] = c.eng.Text().Substitute(queries[name])
	}
	for name, text := range texts {
		st, err := db.PrepareContext(ctx, text)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		st.Close()
	}
	lit := hexLiteral("job")
	wake := func(name string) string { return strings.ReplaceAll(queries[name], "'sqllock'", "'t_fake'") }
	for name, text := range map[string]string{
		"wake_wait":    bind(wake("wake_wait"), lit, lit, "0"),
		"wake_release": bind(wake("wake_release"), lit),
		"wake_probe":   bind(wake("wake_probe"), lit),
	} {
		rows, err := db.QueryContext(ctx, text)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		rows.Close()
	}
	// TiDB's forms are refused: the fake says it is MySQL or MariaDB.
	for _, name := range tidbStmts {
		if _, err := db.PrepareContext(ctx, c.eng.Text().Substitute(queries[tidbPrefix+stmtNames[name]])); err == nil || !strings.Contains(err.Error(), "TiDB") {
			t.Errorf("TiDB's %s: got %v, want it refused as TiDB's", stmtNames[name], err)
		}
	}
}
