package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/engine"

	"sync"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// A table that differs from schema.sql is refused at first use, before any
// lease is taken, with an error that names each difference and the ALTER
// TABLE statement that mends them; run, that statement makes the table
// serve. A table with harmless extras serves as it is.
func TestClient_badTable(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		tests := []struct {
			name string
			edit func(ddl string) string
			want []string // in the error, besides ErrBadTable
		}{
			{"TIMESTAMP(6) expiry", column("expires_at", "TIMESTAMP(6) NOT NULL"),
				[]string{"column expires_at is TIMESTAMP(6) NOT NULL, must be DATETIME(6) NOT NULL"}},
			{"DATETIME without fraction", func(ddl string) string {
				return column("acquired_at", "DATETIME NOT NULL")(column("expires_at", "DATETIME NOT NULL")(ddl))
			}, []string{"column acquired_at is DATETIME NOT NULL, must be DATETIME(6) NOT NULL", "column expires_at is DATETIME NOT NULL"}},
			{"nullable holder", column("holder", "VARBINARY(255) NULL"),
				[]string{"column holder is VARBINARY(255) NULL, must be VARBINARY(255) NOT NULL"}},
			{"case-insensitive names", column("name", "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"),
				[]string{"column name is VARCHAR(255) COLLATE utf8mb4_general_ci NOT NULL, must be VARBINARY(255) NOT NULL"}},
			{"names narrower than MaxNameLen", column("name", "VARBINARY(64) NOT NULL"),
				[]string{"column name is VARBINARY(64) NOT NULL, must be VARBINARY(255) NOT NULL"}},
			{"signed fence", column("fence", "BIGINT NOT NULL"),
				[]string{"column fence is BIGINT"}},
			{"missing column", func(ddl string) string { return dropLine(ddl, "holder") },
				[]string{"column holder is missing, must be VARBINARY(255) NOT NULL"}},
			{"primary key on the name alone", primaryKey("PRIMARY KEY (name), KEY (kind)"),
				[]string{"the primary key is (name), must be (name, kind)"}},
			{"primary key in another order", primaryKey("PRIMARY KEY (kind, name)"),
				[]string{"the primary key is (kind, name), must be (name, kind)"}},
			{"primary key on a prefix", primaryKey("PRIMARY KEY (name(16), kind)"),
				[]string{"the primary key is (name(16), kind), must be (name, kind)"}},
			{"no primary key", primaryKey("KEY (name, kind)"),
				[]string{"there is no primary key, must be (name, kind)"}},
			{"a second unique key", primaryKey("PRIMARY KEY (name, kind), UNIQUE KEY owner_u (owner)"),
				[]string{"unique key owner_u (owner) must not be there"}},
			{"MyISAM", func(ddl string) string { return strings.Replace(ddl, "ENGINE=InnoDB", "ENGINE=MyISAM", 1) },
				[]string{"the engine is MyISAM, must be InnoDB"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if tt.name == "MyISAM" && e.server.TiDB {
					t.Skip("TiDB stores every table alike: it takes ENGINE=MyISAM and reports InnoDB")
				}
				table := e.tableFrom(t, tt.edit)
				c := e.client(t, e.db, table)
				// CreateTable finds the table there, and says so.
				wantErrIs(t, c.CreateTable(ctx), ErrBadTable)
				_, err := c.TryAcquire(ctx, "job", time.Minute)
				wantErrIs(t, err, ErrBadTable)
				assertPrefixOnce(t, err)
				for _, want := range tt.want {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("got %v, want it to say %q", err, want)
					}
				}
				var rows int
				if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&rows); err != nil || rows != 0 {
					t.Fatalf("got %d rows, %v, want none: no lease taken", rows, err)
				}
				// Every call is refused, not only the first.
				_, err = c.Inspect(ctx, "job")
				wantErrIs(t, err, ErrBadTable)

				// The statement the error gives mends the table.
				m := regexp.MustCompile("mend it with: (ALTER TABLE .*)$").FindStringSubmatch(err.Error())
				if m == nil {
					t.Fatalf("got %v, want an ALTER TABLE statement at its end", err)
				}
				if _, err := e.db.ExecContext(ctx, m[1]); err != nil {
					if n, _ := fault.Errno(err); n == 8200 && e.server.TiDB {
						// The refusal above is what this test is about.
						t.Skipf("TiDB cannot run the mending statement (make the table anew instead): %v", err)
					}
					t.Fatalf("%s: %v", m[1], err)
				}
				l, err := c.TryAcquire(ctx, "job", time.Minute)
				for deadline := time.Now().Add(30 * time.Second); err != nil && e.server.Vitess && vtgateLacksColumn(err) && time.Now().Before(deadline); {
					// vtgate learns of an ALTER TABLE from its schema
					// tracker, a moment later: under load, after the
					// ALTER has returned (CI, vitess-sharded).
					time.Sleep(200 * time.Millisecond)
					l, err = c.TryAcquire(ctx, "job", time.Minute)
				}
				if err != nil {
					t.Fatalf("after %s: got %v, want the lease", m[1], err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}

		t.Run("harmless extras", func(t *testing.T) {
			table := e.tableFrom(t, func(ddl string) string {
				ddl = column("name", "VARBINARY(512) NOT NULL")(ddl)
				ddl = column("owner", "VARBINARY(64) NOT NULL")(ddl)
				ddl = column("fence", "BIGINT(20) UNSIGNED NOT NULL")(ddl)
				return primaryKey("note VARCHAR(100) NULL, PRIMARY KEY (name, kind), KEY (expires_at)")(ddl)
			})
			c := e.client(t, e.db, table)
			l := mustAcquire(t, c, "job", time.Minute)
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})

		t.Run("a name in another case", func(t *testing.T) {
			// information_schema may match names without regard to case; a
			// server that keeps case (lower_case_table_names=0) has no
			// table by the Client's name, and the bad one is not checked.
			var lower int
			if err := e.db.QueryRowContext(ctx, "SELECT @@lower_case_table_names").Scan(&lower); err != nil {
				t.Fatal(err)
			}
			if lower != 0 {
				t.Skip("the server folds table names to lower case")
			}
			table := e.tableFrom(t, column("expires_at", "TIMESTAMP(6) NOT NULL"))
			c := e.client(t, e.db, strings.ToUpper(table[:1])+table[1:])
			_, err := c.TryAcquire(ctx, "job", time.Minute)
			if n, _ := fault.Errno(err); n != e.noSuchTable() {
				t.Fatalf("got %v, want the server's %d", err, e.noSuchTable())
			}
		})
	})
}

// tableFrom creates a table from schema.sql changed by edit, dropped when
// the test ends.
func (e *testEnv) tableFrom(t *testing.T, edit func(ddl string) string) string {
	t.Helper()
	table := e.newTable(t)
	if _, err := e.db.Exec("DROP TABLE `" + table + "`"); err != nil {
		t.Fatal(err)
	}
	ddl := edit(strings.ReplaceAll(schema, "`sqllock`", "`"+table+"`")) // in the connection's database, as a person would
	if _, err := e.db.Exec(ddl); err != nil {
		t.Fatalf("%s: %v", ddl, err)
	}
	return table
}

// column returns an edit of schema.sql's DDL that defines column name as def.
func column(name, def string) func(string) string {
	return func(ddl string) string {
		re := regexp.MustCompile(`(?m)^(\s*` + name + `\s+)[^,\n]+,`)
		if !re.MatchString(ddl) {
			panic("no column " + name)
		}
		return re.ReplaceAllString(ddl, "${1}"+def+",")
	}
}

// dropLine returns schema.sql's DDL without column name.
func dropLine(ddl, name string) string {
	return regexp.MustCompile(`(?m)^\s*`+name+`\s+[^,\n]+,\n`).ReplaceAllString(ddl, "")
}

// primaryKey returns an edit of schema.sql's DDL that puts keys in place of
// its primary key.
func primaryKey(keys string) func(string) string {
	return func(ddl string) string {
		return strings.Replace(ddl, "PRIMARY KEY (name, kind)", keys, 1)
	}
}

// On TiDB the Client sends TiDB's one-row forms of the statements that have
// one, with the acquire's first four arguments, and the others as they are.
func TestClient_TiDB_sendsItsForms(t *testing.T) {
	e := newMockEnv(t)
	e.mock.ExpectQuery(firstUseSQL(e.table)).WithoutArgs().
		WillReturnRows(firstUseRows(1, "8.0.11-TiDB-v8.4.0", e.table))
	expectCarries(e.mock, 5)
	e.checked, e.tidb = true, true
	tok := &tokenArg{}
	e.expectExec("tidb_acquire", acquireArgs("job", mockHolder, 60_000_000, tok)[:4], okReply(1795469000000001, 1))
	e.expectExec("tidb_refresh", refreshArgs(30_000_000, "job", tok), okReply(1795469000000002, 1))
	e.expectExec("tidb_release", releaseArgs("job", tok), okReply(0, 1))

	l, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	if l.Fence() != 1795469000000001 {
		t.Errorf("Fence: got %d, want the insert id 1795469000000001", l.Fence())
	}
	if err := l.Refresh(t.Context(), 30*time.Second); err != nil {
		t.Fatalf("Refresh: got %v, want nil", err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}
	e.done()
}

// engine.SchemaColumns, which the first-use check holds tables against, are
// the columns of schema.sql, and its primary key is engine.SchemaKey.
func TestSchema_columns(t *testing.T) {
	var got []string
	for _, line := range strings.Split(schema, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] != "CREATE" && f[0] != "PRIMARY" && f[0] != ")" {
			got = append(got, f[0]+" "+strings.TrimSuffix(strings.Join(f[1:], " "), ","))
		}
	}
	var want []string
	for _, c := range engine.SchemaColumns(MaxNameLen, maxHolderLen) {
		want = append(want, c.Name+" "+c.Def)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("schema.sql's columns:\n%s\nwant (schemaColumns):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(schema, "PRIMARY KEY ("+strings.Join(engine.SchemaKey, ", ")+")") {
		t.Errorf("schema.sql's primary key is not (%s)", strings.Join(engine.SchemaKey, ", "))
	}
}

// nullingConnector connects to a real server and answers the first-use
// check's rows about columns with IS_NULLABLE NULL, as an engine that types
// a UNION's columns by its first row (whose last columns are NULL) does.
type nullingConnector struct{ driver.Connector }

func (nc nullingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := nc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return nullingConn{passConn{c}}, nil
}

type nullingConn struct{ passConn }

func (c nullingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	if err != nil || !strings.Contains(query, "information_schema.COLUMNS") {
		return rows, err
	}
	return nullingRows{rows}, nil
}

type nullingRows struct{ driver.Rows }

func (r nullingRows) Next(dest []driver.Value) error {
	if err := r.Rows.Next(dest); err != nil {
		return err
	}
	if what, _ := dest[0].([]byte); string(what) == "column" {
		dest[4] = nil
	}
	return nil
}

// An answer information_schema never gives (NULL for IS_NULLABLE, a NOT
// NULL column of its own) is "cannot check", never a diagnosis of the
// table, which would blame columns that are as schema.sql has them.
func TestClient_firstUse_untrustedTableAnswer(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		db := sql.OpenDB(nullingConnector{e.quietConnector(t, func(*mysql.Config) {})})
		t.Cleanup(func() { db.Close() })
		c := e.client(t, db, table)
		err := c.CreateTable(testCtx(t))
		wantErrIs(t, err, ErrUnsupportedServer)
		if errors.Is(err, ErrBadTable) {
			t.Errorf("CreateTable: got %v, want no diagnosis of the table", err)
		}
		assertErrContains(t, err, "cannot check the table: information_schema answered NULL for COLUMNS.IS_NULLABLE")
	})
}

// A table an operator alters under a running Client is noticed by it, not
// only by Clients made afterwards: with expires_at made DATETIME without
// fractions, every lease written would end up to a second early (several
// holders at once with 1s leases, before this check). Within a second (here
// made due at once) every statement that takes or extends a lease fails
// with the difference, wrapping ErrBadTable, and writes nothing; once the
// table is mended, they serve again.
func TestClient_tableAlteredWhileRunning(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it alters the table")
		ctx := testCtx(t)
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		other := e.client(t, e.db, table)
		held, err := c.TryAcquire(ctx, "held", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if _, err := other.Inspect(ctx, "held"); err != nil { // its first use
			t.Fatal(err)
		}
		alter := func(def string) {
			t.Helper()
			if _, err := e.db.ExecContext(ctx, "ALTER TABLE `"+table+"` MODIFY COLUMN expires_at "+def); err != nil {
				t.Fatal(err)
			}
			c.eng.SetRecheckDue(0) // due now, not within the second
		}
		alter("DATETIME NOT NULL")
		wantBad := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, ErrBadTable) || !strings.Contains(err.Error(), "expires_at") || !strings.Contains(err.Error(), "altered") {
				t.Fatalf("%s after the ALTER: got %v, want ErrBadTable naming expires_at and the change", what, err)
			}
		}
		_, err = c.TryAcquire(ctx, "x", time.Minute)
		wantBad("TryAcquire", err)
		wantBad("Refresh", held.Refresh(ctx, time.Minute))
		if !e.oneRow() {
			_, err = c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
			wantBad("TryAcquireSet", err)
			_, err = c.Semaphore("sem", 2).TryAcquire(ctx, time.Minute)
			wantBad("Semaphore.TryAcquire", err)
		}
		for _, name := range []string{"x", "a"} {
			if info, err := other.Inspect(ctx, name); err != nil || info.Held {
				t.Fatalf("Inspect(%q): got %+v, %v, want it free: nothing written", name, info, err)
			}
		}
		alter("DATETIME(6) NOT NULL")
		l, err := c.TryAcquire(ctx, "x", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire once the table is mended: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := held.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh once the table is mended: %v", err)
		}
	})
}

// vtgateLacksColumn reports whether err is vtgate's own refusal of a column
// its schema tracker has not seen yet: "column 'x' not found in table 'y'"
// (1054, from vtgate, not from MySQL, which says "Unknown column").
func vtgateLacksColumn(err error) bool {
	n, ok := fault.Errno(err)
	return ok && n == 1054 && strings.Contains(err.Error(), "not found in table")
}

func TestSchema(t *testing.T) {
	if !strings.HasPrefix(schema, "CREATE TABLE IF NOT EXISTS `sqllock` (") {
		t.Errorf("schema: got %q, want a CREATE TABLE IF NOT EXISTS `sqllock`", schema)
	}
	if got := strings.Count(strings.ToUpper(schema), "CREATE "); got != 1 {
		t.Errorf("CREATE statements: got %d, want 1", got)
	}
	if strings.Contains(schema, ";") || strings.Contains(schema, "--") {
		t.Errorf("schema: got %q, want one statement without semicolon or comments", schema)
	}
}

// The forms are chosen once: a second check's choice changes nothing, and
// calls reading them while they are chosen see one whole value (run with
// -race).
func TestClient_chooseForms_once(t *testing.T) {
	e := newMockEnv(t) // sends nothing here
	c := e.c
	if c.eng.Forms().Chosen {
		t.Fatal("chosen before any check")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				f := c.eng.Forms()
				if f.LockWait != strings.HasPrefix(f.SQL[qAcquire], queries["lock_wait_mariadb"]) {
					t.Error("a reader saw the flags of one value and the text of another")
					return
				}
			}
		}()
	}
	c.chooseForms("10.11.19-MariaDB", "`test`.`sqllock`", "'test'", true)
	wg.Wait()
	c.chooseForms("8.0.11-TiDB-v9.0.0", "`test`.`sqllock`", "'test'", false)
	if f := c.eng.Forms(); !f.LockWait || f.TiDB || c.wait.Peek("").Refused {
		t.Errorf("after a second choice: %+v, channels refused %t; want MariaDB's forms kept", *f, c.wait.Peek("").Refused)
	}
}

// What a check or a proof learned is never lost: marks made at once by
// many calls all stay, and choosing the forms keeps those made before it
// (run with -race).
func TestClient_mark_keptByEveryChange(t *testing.T) {
	c, err := New(newMockEnv(t).db) // sends nothing here
	if err != nil {
		t.Fatal(err)
	}
	if f := c.eng.Forms(); f.Checked || f.Proven || f.Later != [engine.NumLater]bool{} {
		t.Fatalf("a new Client: %+v; want nothing learned", *f)
	}
	c.eng.Mark(func(f *engine.Forms) *bool { return &f.Checked })
	var wg sync.WaitGroup
	for i := range engine.NumLater {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.eng.Mark(func(f *engine.Forms) *bool { return &f.Later[i] })
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.chooseForms("10.11.19-MariaDB", "`test`.`sqllock`", "'test'", true)
	}()
	c.markProven()
	wg.Wait()
	f := c.eng.Forms()
	var every [engine.NumLater]bool
	for i := range every {
		every[i] = true
	}
	if !f.Chosen || !f.LockWait || !f.Checked || !f.Proven || f.Later != every {
		t.Errorf("after every mark and the choice: chosen %v (MariaDB's %v), checked %v, proven %v, later %v; want all",
			f.Chosen, f.LockWait, f.Checked, f.Proven, f.Later)
	}
}

// markProven makes c take the proof of its statements as made, for tests
// whose subject is not the proof.
func (c *Client) markProven() { c.eng.Mark(func(f *engine.Forms) *bool { return &f.Proven }) }

// chooseForms chooses c's forms as its first-use check does, and tells
// the Client, as the check does.
func (c *Client) chooseForms(version, qualified, db string, carries bool) {
	c.chosen(c.eng.Choose(version, qualified, db, carries), version)
}

// chooseFormsOn chooses c's forms for version as its first-use check
// would, in the database db's connections have.
func chooseFormsOn(t *testing.T, c *Client, db *sql.DB, version string, carries bool) {
	t.Helper()
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	qualified, lit, err := sqltext.Qualify(c.table, name)
	if err != nil {
		t.Fatal(err)
	}
	c.chooseForms(version, qualified, lit, carries)
}

// The forms' names and marks in queries.sql (sqltext), and the statements
// with a one-row form (engine.OneRowStmts).
const (
	tidbPrefix = sqltext.TiDBPrefix
	tidbHint   = sqltext.TiDBHint
)

var tidbStmts = engine.OneRowStmts
