package sqllock

import (
	"regexp"
	"strings"
	"testing"
	"time"
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
					if n, _ := serverErrno(err); n == 8200 && e.server.TiDB {
						// The refusal above is what this test is about.
						t.Skipf("TiDB cannot run the mending statement (make the table anew instead): %v", err)
					}
					t.Fatalf("%s: %v", m[1], err)
				}
				l, err := c.TryAcquire(ctx, "job", time.Minute)
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
			if n, _ := serverErrno(err); n != e.noSuchTable() {
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
	ddl := edit(withTable(schema, table))
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

// schemaColumns, which the first-use check holds tables against, are the
// columns of schema.sql, and its primary key is schemaKey.
func TestSchema_columns(t *testing.T) {
	var got []string
	for _, line := range strings.Split(schema, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] != "CREATE" && f[0] != "PRIMARY" && f[0] != ")" {
			got = append(got, f[0]+" "+strings.TrimSuffix(strings.Join(f[1:], " "), ","))
		}
	}
	var want []string
	for _, c := range schemaColumns {
		want = append(want, c.name+" "+c.def)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("schema.sql's columns:\n%s\nwant (schemaColumns):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(schema, "PRIMARY KEY ("+strings.Join(schemaKey, ", ")+")") {
		t.Errorf("schema.sql's primary key is not (%s)", strings.Join(schemaKey, ", "))
	}
}
