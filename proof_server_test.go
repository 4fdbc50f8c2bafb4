package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// gmsEnv names the DSN of a go-mysql-server (scripts/gms up; scripts/gms
// dsn), which TestClient_firstUse_refusesGoMySQLServer holds a Client to.
const gmsEnv = "SQLLOCK_TEST_GMS_DSN"

// go-mysql-server's in-memory engine runs each statement as MySQL does
// alone, and not together: a Client refuses it at its first use, naming
// what failed, before any lease is taken.
func TestClient_firstUse_refusesGoMySQLServer(t *testing.T) {
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
	c, err := New(db, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := testCtx(t)
	err = c.CreateTable(ctx)
	t.Logf("CreateTable: %v", err)
	wantErrIs(t, err, ErrUnsupportedServer)
	if strings.Contains(err.Error(), "no rows in result set") || errors.Is(err, ErrBadTable) {
		t.Errorf("CreateTable: got %v, want an error naming what the server failed to do", err)
	}
	_, err = c.TryAcquire(ctx, "job", time.Minute)
	t.Logf("TryAcquire: %v", err)
	wantErrIs(t, err, ErrUnsupportedServer)
	// It calls itself MySQL 8.0.31; the proof of the statements finds a
	// refresh by the owner of a live lease reporting nothing extended
	// (internal/engine/prover.go), before the row lock's proof.
	assertErrContains(t, err, "statement refresh: a refresh by the owner of a live lease reported 0")
}

// A read-only server is refused before any write, even for an account that
// could write there (root: SUPER, or MariaDB's READ ONLY ADMIN), with an
// error that says so and that the waiting calls pass over as they pass
// over the server's own refusal; once writable, the next call proves and
// acquires. On the tests' own server, which may be made read-only.
func TestClient_firstUse_refusesReadOnlyServer(t *testing.T) {
	if os.Getenv(ownServerEnv) == "" {
		t.Skipf("set %s when the test server is the tests' own, to make it read-only", ownServerEnv)
	}
	soleServer(t, "makes the server read-only under "+ownServerEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB || e.server.Vitess {
			t.Skipf("%s: its read-only settings refuse every account, and the proof does not ask them", e.server.Label)
		}
		table := e.newTable(t)
		setGlobal(t, e, "read_only", "ON", "OFF")
		c := e.client(t, e.db, table)
		ctx := testCtx(t)
		_, err := c.TryAcquire(ctx, "job", time.Minute)
		if !errors.Is(err, errReadOnlyServer) || errors.Is(err, ErrUnsupportedServer) || !passable(err) || classify(err) != fault.Refused {
			t.Fatalf("TryAcquire on a read-only server as root: got %v, want the read-only refusal, passable", err)
		}
		assertErrContains(t, err, "read-only (@@read_only = 1)")
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("%d proof rows written on a read-only server, want 0", n)
		}
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err = c.Acquire(short, "job", time.Minute)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errReadOnlyServer) {
			t.Errorf("Acquire on a read-only server: got %v, want its deadline wrapping the read-only refusal", err)
		}
		if _, err := e.db.Exec("SET GLOBAL read_only = OFF"); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, c, "job", time.Minute)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// roundRobin is a TCP balancer on loopback that sends each new connection
// to the next of its backends in turn, as a load balancer over several
// primaries does.
func roundRobin(t *testing.T, backends ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for i := 0; ; i++ {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", backends[i%len(backends)])
			if err != nil {
				client.Close()
				continue
			}
			go func() { _, _ = io.Copy(server, client); server.Close() }()
			go func() { _, _ = io.Copy(client, server); client.Close() }()
		}
	}()
	return ln.Addr().String()
}

// A pool whose connections reach two servers (a round-robin balancer over
// two primaries) is refused at first use, naming both servers: each would
// keep leases of its own, and two Clients could both hold one name.
func TestClient_firstUse_refusesTwoServers(t *testing.T) {
	envs, table, db := balancedPool(t)
	c := envs[0].client(t, db, table)
	_, err := c.TryAcquire(testCtx(t), "job", time.Minute)
	t.Logf("TryAcquire through the balancer: %v", err)
	wantTwoServers(t, err, envs)
}

// balancedPool returns two servers' environments, a table of the test's
// own on both, and a pool whose connections go to them in turn through a
// round-robin balancer. It skips unless there are two such servers.
func balancedPool(t *testing.T) (envs []*testEnv, table string, db *sql.DB) {
	t.Helper()
	requireServers(t)
	// Two MariaDB servers if there are, which tell themselves apart by
	// host, port and datadir alone; else MariaDB and MySQL, or two MySQL.
	servers := slices.Clone(testServers)
	slices.SortStableFunc(servers, func(a, b testServer) int {
		if a.MariaDB == b.MariaDB {
			return 0
		} else if a.MariaDB {
			return -1
		}
		return 1
	})
	for _, s := range servers {
		if s.Err == nil && !s.Fake && !s.TiDB && !s.Vitess && len(envs) < 2 {
			envs = append(envs, newEnv(t, s, variants[0]))
		}
	}
	if len(envs) < 2 {
		t.Skipf("%s names fewer than two MySQL or MariaDB servers, which the balancer needs", dsnEnv)
	}
	table = envs[0].newTable(t)
	if _, err := envs[1].db.Exec(strings.ReplaceAll(schema, "`sqllock`", "`"+table+"`")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = envs[1].db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	addr := roundRobin(t, envs[0].serverAddr(t), envs[1].serverAddr(t))
	db = sql.OpenDB(envs[0].quietConnector(t, func(c *mysql.Config) { c.Addr = addr }))
	t.Cleanup(func() { db.Close() })
	return envs, table, db
}

// wantTwoServers fails t unless err refuses a pool whose connections reach
// the servers of envs, naming each.
func wantTwoServers(t *testing.T, err error, envs []*testEnv) {
	t.Helper()
	wantErrIs(t, err, ErrUnsupportedServer)
	assertErrContains(t, err, "the pool's connections reach different servers")
	for _, e := range envs {
		if e.server.MariaDB != envs[0].server.MariaDB {
			assertErrContains(t, err, e.server.Version)
		} else if e.server.MariaDB {
			var port string
			if err := e.db.QueryRow("SELECT @@port").Scan(&port); err != nil {
				t.Fatal(err)
			}
			assertErrContains(t, err, " "+port+" ")
		} else {
			var uuid string
			if err := e.db.QueryRow("SELECT @@server_uuid").Scan(&uuid); err != nil {
				t.Fatal(err)
			}
			assertErrContains(t, err, uuid)
		}
	}
}
