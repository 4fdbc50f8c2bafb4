package sqllock

import (
	"database/sql"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// ownServerEnv, when set, says the test server is the tests' own: tests may
// change its global variables and accounts (a read-only server, a full
// one). Never set it for a shared server.
const ownServerEnv = "SQLLOCK_TEST_OWN_SERVER"

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// limitedUser returns a *sql.DB for an account with the privileges sqllock
// needs on table and no administrative ones, dropped when the test ends.
func limitedUser(t *testing.T, e *testEnv, table string) *sql.DB {
	t.Helper()
	// Every host form, so that no anonymous account of a fresh install
	// matches first.
	for _, host := range []string{"'%'", "'localhost'", "'127.0.0.1'"} {
		user := "sqllock_app@" + host
		for _, q := range []string{
			"DROP USER IF EXISTS " + user,
			"CREATE USER " + user + " IDENTIFIED BY 'app'",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + table + "` TO " + user,
		} {
			if _, err := e.db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() { _, _ = e.db.Exec("DROP USER IF EXISTS " + user) })
	}
	return e.openDBWith(t, func(c *mysql.Config) { c.User, c.Passwd = "sqllock_app", "app" })
}

// setGlobal sets a global variable of the tests' own server, and sets it
// back to undo when the test ends.
func setGlobal(t *testing.T, e *testEnv, name, value, undo string) {
	t.Helper()
	if _, err := e.db.Exec("SET GLOBAL " + name + " = " + value); err != nil {
		t.Fatalf("SET GLOBAL %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := e.db.Exec("SET GLOBAL " + name + " = " + undo); err != nil {
			t.Errorf("SET GLOBAL %s back: %v", name, err)
		}
	})
}
