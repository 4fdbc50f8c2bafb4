package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// tamperConnector connects to a real server and changes the answer of
// every statement whose text holds match, as a layer that runs that one
// statement wrongly would. It prepares everything (it implements no
// ExecerContext), so the text statements go through it too.
type tamperConnector struct {
	driver.Connector
	match  string
	answer func(res driver.Result, err error) (driver.Result, error)
}

func (tc *tamperConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := tc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &tamperConn{passConn: passConn{c}, tc: tc}, nil
}

type tamperConn struct {
	passConn
	tc *tamperConnector
}

func (c *tamperConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil || !strings.Contains(query, c.tc.match) {
		return st, err
	}
	return &tamperStmt{passStmt: passStmt{st}, tc: c.tc}, nil
}

type tamperStmt struct {
	passStmt
	tc *tamperConnector
}

func (s *tamperStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.tc.answer(s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args))
}

// answerWith returns an answer of insert id id and rows affected rows,
// whatever the server said.
func answerWith(id, rows int64) func(driver.Result, error) (driver.Result, error) {
	return func(driver.Result, error) (driver.Result, error) { return rewrittenResult{id: id, rows: rows}, nil }
}

// Each statement a Client sends is proven, with its answer that takes and
// its answer that refuses, before its first real use: a layer that answers
// one of them wrongly is refused then, with an error naming the statement,
// and no lease is taken through it. The single-name statements are proven
// at the Client's first write; the set, semaphore and Once statements at
// their own first use, so a Client whose layer breaks only sets still
// takes single names.
func TestClient_firstUse_provesEveryStatement(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB || e.server.Vitess {
			t.Skipf("%s takes the one-row forms, whose texts these layers do not match", e.server.Label)
		}
		tests := []struct {
			name   string
			match  string // in the statement's text
			answer func(driver.Result, error) (driver.Result, error)
			use    func(ctx context.Context, c *Client) error // the kind's first use
			want   string
		}{
			{"owner's refresh not extended", "SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),\n    fence", answerWith(0, 0), nil,
				"statement refresh: a refresh by the owner of a live lease reported 0"},
			{"check changes no row", "SET acquired_at = acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND\nWHERE name", answerWith(0, 0), nil,
				"statement check: a check by the owner of a live lease changed 0 rows instead of 1"},
			{"release_at_least not ours", "SET expires_at = acquired_at + INTERVAL ? MICROSECOND,\n    fence", answerWith(0, 0), nil,
				"statement release_at_least"},
			{"release deletes another's", "DELETE FROM", answerWith(0, 1), nil,
				"statement release: a release under another token changed 1 rows instead of 0"},
			{"set refused without 1690", "fence + 1 + 18446744073709551615)", func(res driver.Result, err error) (driver.Result, error) {
				if err != nil {
					return rewrittenResult{id: 5, rows: 6}, nil // the overflow raised no error
				}
				return res, nil
			}, func(ctx context.Context, c *Client) error {
				_, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				return err
			}, "statement all_acquire: an acquire of a set whose names another owner held succeeded"},
			{"set check changes no row", "AND name IN", func(res driver.Result, err error) (driver.Result, error) {
				return rewrittenResult{rows: 0}, err
			}, func(ctx context.Context, c *Client) error {
				_, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				return err
			}, "by the owner changed 0 rows instead of 2"},
			{"set refresh extends a set with its lease rows gone", "SET l.expires_at", func() func(driver.Result, error) (driver.Result, error) {
				refusals := 0
				return func(res driver.Result, err error) (driver.Result, error) {
					if err != nil {
						// The first, under another token, stays refused.
						if refusals++; refusals == 2 {
							return rewrittenResult{rows: 1}, nil
						}
					}
					return res, err
				}
			}(), func(ctx context.Context, c *Client) error {
				_, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				return err
			}, "statement all_refresh: a refresh of a set whose lease rows were deleted succeeded"},
			{"full semaphore gives a slot", "'F', ?, '', UTC_TIMESTAMP(6)", answerWith(slotTaken+1, 2), func(ctx context.Context, c *Client) error {
				_, err := c.Semaphore("jobs", 2).TryAcquire(ctx, time.Minute)
				return err
			}, "statement slot_acquire: taking a slot of a full semaphore reported"},
			{"Once recorded for another token", "SELECT l.name, 'D'", answerWith(1, 1), func(ctx context.Context, c *Client) error {
				_, err := c.Once(ctx, "once", func(_ context.Context, _ *Lock) error { return nil })
				return err
			}, "statement once_record: a completion record under another token reported 1"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				table := e.newTable(t)
				ctx := testCtx(t)
				db := sql.OpenDB(&tamperConnector{Connector: e.quietConnector(t, func(*mysql.Config) {}), match: tt.match, answer: tt.answer})
				t.Cleanup(func() { db.Close() })
				c := e.client(t, db, table)
				var err error
				if tt.use == nil {
					_, err = c.TryAcquire(ctx, "job", time.Minute)
				} else {
					// The single-name proof passes: the layer breaks only
					// this kind's statements.
					mustAcquire(t, c, "single", time.Minute).Release(ctx)
					err = tt.use(ctx, c)
				}
				wantErrIs(t, err, ErrUnsupportedServer)
				assertErrContains(t, err, tt.want)
				if n := e.proofRows(t, table); n != 0 {
					t.Errorf("%d proof rows left, want 0", n)
				}
				var leases int
				if err := e.db.QueryRow("SELECT COUNT(*) FROM `" + table + "` WHERE kind = 'L'").Scan(&leases); err != nil {
					t.Fatal(err)
				}
				if leases != 0 {
					t.Errorf("%d lease rows after the refusal, want 0", leases)
				}
			})
		}
	})
}

// A set's statements are sent as text, on whichever connection the pool
// gives. MySQL Router with connection sharing refuses a text statement that
// calls LAST_INSERT_ID on a connection nothing has pinned (3566), as it
// refuses SELECT LAST_INSERT_ID(1) there; the set's acquire passes it
// (Router 9.7.4). With no idle connection kept, every statement meets a
// fresh connection, which nothing pinned: this fails if a router refuses it.
func TestClient_TryAcquireSet_freshConnections(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.Vitess {
			t.Skip("sets are refused through Vitess")
		}
		table := e.newTable(t)
		db := e.openDB(t)
		db.SetMaxIdleConns(0)
		c := e.client(t, db, table)
		for i := range 3 {
			l := mustAcquireSet(t, c, time.Minute, "a", "b")
			if err := l.Refresh(testCtx(t), time.Minute); err != nil {
				t.Fatalf("Refresh %d: %v", i, err)
			}
			if err := l.Release(testCtx(t)); err != nil {
				t.Fatalf("Release %d: %v", i, err)
			}
		}
	})
}
