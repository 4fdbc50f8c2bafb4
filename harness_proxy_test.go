package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/faultproxy"
)

// Command codes of the MySQL client/server protocol that the tests name.
const (
	proxyComQuery       = faultproxy.ComQuery
	proxyComPing        = faultproxy.ComPing
	proxyComStmtPrepare = faultproxy.ComStmtPrepare
	proxyComStmtExecute = faultproxy.ComStmtExecute
)

// A proxy is a [faultproxy.Proxy] between MySQL clients and one server,
// with the two faults the tests name by a bool and a duration.
type proxy struct{ *faultproxy.Proxy }

// startProxy starts a proxy on 127.0.0.1 that forwards every connection to
// target (host:port). It stops in t.Cleanup: the listener and every
// connection are closed and its goroutines have ended when Cleanup returns.
func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	return &proxy{p}
}

// Stall holds the bytes of every connection, both ways, while on is true,
// like a network partition; new connections are accepted but get nothing.
// When it ends the held bytes flow on in order.
func (p *proxy) Stall(on bool) {
	if on {
		p.Proxy.Stall(faultproxy.Both)
	} else {
		p.Proxy.Stall(0)
	}
}

// Latency delays each chunk the server sends by d before the proxy forwards
// it to the client; 0 ends the delay.
func (p *proxy) Latency(d time.Duration) { p.Proxy.Latency(faultproxy.ToClient, d) }

// eachProxyConfig runs f on each test server, with the driver configuration
// of its DSN.
func eachProxyConfig(t *testing.T, f func(t *testing.T, cfg *mysql.Config)) {
	t.Helper()
	eachServer(t, func(t *testing.T, s testServer) {
		if s.Vitess {
			t.Skipf("%s is %s: %s", s.Label, s.Version, vitessNoProxy)
		}
		cfg, err := mysql.ParseDSN(s.DSN)
		if err != nil {
			t.Fatalf("%s: %v", dsnEnv, err)
		}
		if cfg.Net != "tcp" {
			t.Skipf("%s is reached over %q; the proxy needs tcp", s.Label, cfg.Net)
		}
		// Connection faults make the driver log; the tests check errors instead.
		cfg.Logger = log.New(io.Discard, "", 0)
		f(t, cfg)
	})
}

// openProxyTestDB opens a pool of at most one connection with cfg, closed in
// t.Cleanup. With addr set, it dials addr in clear instead of cfg.Addr.
func openProxyTestDB(t *testing.T, cfg *mysql.Config, addr string) *sql.DB {
	t.Helper()
	cfg = cfg.Clone()
	if addr != "" {
		cfg.Addr = addr
		// The proxy reads commands in the stream, so it must be plain.
		cfg.TLS, cfg.TLSConfig = nil, "false"
		if err := cfg.Apply(mysql.EnableCompression(false)); err != nil {
			t.Fatal(err)
		}
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func TestProxy_countsCommands(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()

		stmt, err := db.PrepareContext(ctx, "DO ?")
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if _, err := stmt.ExecContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		// The handshake and auth packets are no commands.
		if got, want := p.Commands(), map[byte]int{proxyComStmtPrepare: 1, proxyComStmtExecute: 1}; !maps.Equal(got, want) {
			t.Errorf("cold Exec: commands %v, want %v", got, want)
		}

		p.ResetCounts()
		if _, err := stmt.ExecContext(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if got, want := p.Commands(), map[byte]int{proxyComStmtExecute: 1}; !maps.Equal(got, want) {
			t.Errorf("warm Exec: commands %v, want %v", got, want)
		}
		if n := p.CommandCount(); n != 1 {
			t.Errorf("warm Exec: CommandCount() = %d, want 1", n)
		}
	})
}

func TestProxy_stallHoldsUntilHealed(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()
		if err := db.PingContext(ctx); err != nil {
			t.Fatal(err)
		}

		p.Stall(true)
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		var v int
		if err := db.QueryRowContext(short, "SELECT 1").Scan(&v); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("query during stall: %v, want %v", err, context.DeadlineExceeded)
		}

		// A query sent during the stall completes once it ends: its bytes (and
		// those of the new connection's handshake) were held, not dropped.
		done := make(chan error, 1)
		go func() {
			var v int
			err := db.QueryRowContext(ctx, "SELECT 2").Scan(&v)
			if err == nil && v != 2 {
				err = fmt.Errorf("got %d, want 2", v)
			}
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("query returned during stall: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		p.Stall(false)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("query after stall: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("query still blocked 10s after the stall ended")
		}
	})
}

func TestProxy_cutAfterCommandHidesOutcome(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		direct := openProxyTestDB(t, cfg, "")
		ctx := context.Background()
		table := "proxy_cut_" + strconv.FormatInt(time.Now().UnixNano(), 36)
		if _, err := direct.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := direct.ExecContext(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		})

		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		stmt, err := db.PrepareContext(ctx, "INSERT INTO "+table+" (id) VALUES (?)")
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if _, err := stmt.ExecContext(ctx, 1); err != nil {
			t.Fatal(err)
		}

		p.CutAfterCommand(proxyComStmtExecute, 1)
		if _, err := stmt.ExecContext(ctx, 2); err == nil {
			t.Fatal("Exec through a cut succeeded; want an error")
		} else {
			t.Logf("Exec through a cut: %v", err)
		}
		// The client may learn of the cut before the server has run the
		// statement, so wait for the row.
		deadline := time.Now().Add(5 * time.Second)
		for {
			var n int
			if err := direct.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+" WHERE id = 2").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the server did not apply the cut INSERT")
			}
			time.Sleep(10 * time.Millisecond)
		}

		// The cut fires once.
		if _, err := stmt.ExecContext(ctx, 3); err != nil {
			t.Fatalf("Exec after the cut: %v", err)
		}
	})
}

func TestProxy_cutAllBreaksLiveConnection(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.PingContext(ctx); err != nil {
			t.Fatal(err)
		}

		p.CutAll()
		if err := conn.PingContext(ctx); err == nil {
			t.Fatal("Ping on a cut connection succeeded; want an error")
		}
		conn.Close()
		// New connections are served as usual.
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("Ping after CutAll: %v", err)
		}
	})
}

func TestProxy_refuseAndLatency(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()

		p.Refuse(true)
		if err := db.PingContext(ctx); err == nil {
			t.Fatal("Ping while refusing succeeded; want an error")
		}
		p.Refuse(false)
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("Ping after refusing: %v", err)
		}

		const d = 200 * time.Millisecond
		p.Latency(d)
		p.ResetCounts()
		start := time.Now()
		if err := db.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < d {
			t.Errorf("Ping with latency %v took %v", d, took)
		}
		if got, want := p.Commands(), map[byte]int{proxyComPing: 1}; !maps.Equal(got, want) {
			t.Errorf("Ping: commands %v, want %v", got, want)
		}
	})
}

// noRecheck puts c's next table recheck an hour away. The recheck, once a
// second (internal/engine/tablecheck.go, tested in firstuse_table_test.go),
// is a statement of its own: a test that counts the statements of a call
// would count it whenever the machine is slow enough for a second to pass.
func noRecheck(c *Client) { c.eng.SetRecheckDue(time.Now().Add(time.Hour).UnixNano()) }
