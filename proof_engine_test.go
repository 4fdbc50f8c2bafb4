package sqllock

import (
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// Past the row lock, go-mysql-server fails the semantics the statements
// rely on too (proof_engine.go): each is refused, naming what failed.
func TestClient_proveEngine_refusesGoMySQLServer(t *testing.T) {
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
	if _, err := db.ExecContext(ctx, strings.ReplaceAll(schema, "`sqllock`", "`"+table+"`")); err != nil {
		t.Fatal(err)
	}
	c, err := New(db, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a, _ := newToken()
	b, _ := newToken()
	err = c.proveEngine(ctx, conn, &c.eng.Forms().SQL, "8.0.31", proofPrefix+a, a, b)
	t.Logf("proveEngine: %v", err)
	wantErrIs(t, err, ErrUnsupportedServer)
	for _, want := range []string{"another order than it writes them", "lost the fraction of a second", "gave no error 1690"} {
		assertErrContains(t, err, want)
	}
}
