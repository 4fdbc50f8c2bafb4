package sqllock

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"
)

// vitessEnv names the Vitess keyspaces to test, as label=DSN pairs separated
// by commas (scripts/vitess env prints them): a Client must refuse Vitess
// there. .ci/run sets it for this test alone; unset, the test skips.
const vitessEnv = "SQLLOCK_TEST_VITESS_DSN"

// Through Vitess (vtgate in front of MySQL), a Client refuses at its first
// use, naming Vitess, in an unsharded and a sharded keyspace; and the steps
// of the proof alone, without the version, refuse it too.
func TestVitess_refusedAtFirstUse(t *testing.T) {
	spec := os.Getenv(vitessEnv)
	if spec == "" {
		t.Skipf("%s is not set: scripts/vitess up && eval \"$(scripts/vitess env)\" starts Vitess and sets it", vitessEnv)
	}
	for _, pair := range strings.Split(spec, ",") {
		label, dsn, ok := strings.Cut(pair, "=")
		if !ok {
			t.Fatalf("%s: %q is not label=DSN", vitessEnv, pair)
		}
		t.Run(label, func(t *testing.T) {
			db, err := sql.Open("mysql", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			ctx := testCtx(t)
			table := "vt_" + strings.ReplaceAll(label, "-", "_") + "_" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
			var keyspace string
			if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&keyspace); err != nil {
				t.Fatal(err)
			}
			// A sharded keyspace needs the table's vindex before the table;
			// an unsharded one refuses it, which is fine.
			_, verr := db.ExecContext(ctx, "ALTER VSCHEMA ON `"+keyspace+"`.`"+table+"` ADD VINDEX xxhash(name) USING xxhash")
			t.Logf("vindex on %s.%s: %v", keyspace, table, verr)
			if _, err := db.ExecContext(ctx, strings.ReplaceAll(schema, tablePlaceholder, "`"+table+"`")); err != nil {
				t.Fatalf("create %s: %v", table, err)
			}
			t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + table + "`") })

			c, err := New(db, WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			err = c.CreateTable(ctx)
			wantErrIs(t, err, ErrUnsupportedServer)
			assertErrContains(t, err, "Vitess")
			_, err = c.TryAcquire(ctx, "job", time.Minute)
			wantErrIs(t, err, ErrUnsupportedServer)
			assertErrContains(t, err, "Vitess")
			if c.proven {
				t.Error("proven: got true, want false")
			}

			// The statements alone give Vitess away: the proof does not
			// rest on the version string. Each try under fresh tokens.
			for i := range 3 {
				conn, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				a, _ := newToken()
				b, _ := newToken()
				text := c.sql
				err = c.proveStatements(ctx, conn, &text, "vitess", proofPrefix+a, a, b)
				conn.Close()
				t.Logf("proof %d without the version: %v", i, err)
				wantErrIs(t, err, ErrUnsupportedServer)
				db.ExecContext(context.WithoutCancel(ctx), c.substitute(queries["proof_clear"]), proofPrefix+a)
			}
		})
	}
}
