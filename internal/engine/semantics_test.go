package engine

import (
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
)

// gmsEnv names a go-mysql-server's DSN (scripts/gms up; scripts/gms dsn),
// as the root package's tests read it.
const gmsEnv = "SQLLOCK_TEST_GMS_DSN"

// Past the row lock, go-mysql-server fails the semantics the statements
// rely on too (semantics.go): each is refused, naming what failed.
func TestServer_proveEngine_refusesGoMySQLServer(t *testing.T) {
	dsn := os.Getenv(gmsEnv)
	if dsn == "" {
		t.Skipf("set %s to a go-mysql-server's DSN (scripts/gms up; scripts/gms dsn)", gmsEnv)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	table := fmt.Sprintf("tgms_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	ctx := testCtx(t)
	if _, err := db.ExecContext(ctx, strings.ReplaceAll(testSchema, "`sqllock`", "`"+table+"`")); err != nil {
		t.Fatal(err)
	}
	srv := newTestServer(t, db, table)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a, _ := srv.cfg.Token()
	b, _ := srv.cfg.Token()
	err = srv.proveEngine(ctx, conn, &srv.Forms().SQL, "8.0.31", ProofPrefix+a, a, b)
	t.Logf("proveEngine: %v", err)
	wantErr(t, err, errUnsupported, "another order than it writes them", "lost the fraction of a second", "gave no error 1690")
}
