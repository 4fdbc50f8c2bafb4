package sqllock

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Real-server tests of the work run under a lease: keep-alive, Do, Check,
// Held, List and Close. Timings in them are correctness bounds with wide
// slack, never performance claims.

// pollAcquire makes b try to take name until it succeeds and returns when
// the successful attempt was sent: the takeover committed after that.
func pollAcquire(t *testing.T, b *Client, name string, ttl time.Duration) (*Lock, time.Time) {
	t.Helper()
	ctx := testCtx(t)
	for {
		sent := time.Now()
		l, err := b.TryAcquire(ctx, name, ttl)
		if err == nil {
			return l, sent
		}
		wantErrIs(t, err, ErrNotAcquired)
		time.Sleep(2 * time.Millisecond)
	}
}

// isolationLevels are the levels a session may run at, as the server's
// isolation variable spells them.
var isolationLevels = []string{"READ-COMMITTED", "REPEATABLE-READ", "SERIALIZABLE"}

// isolated returns a *sql.DB on the environment's DSN whose sessions run at
// level (one of isolationLevels).
func (e *testEnv) isolated(t testing.TB, level string) *sql.DB {
	t.Helper()
	if level == "SERIALIZABLE" && e.server.TiDB {
		t.Skipf("%s is %s: TiDB refuses SERIALIZABLE (error 8048)", e.server.Label, e.server.Version)
	}
	return e.openDBWith(t, func(c *mysql.Config) { setParam(c, isolationVariable(e.server), "'"+level+"'") })
}

// guardUnsafe reports whether a Note 1592's reason is one the session guard
// gives: a system variable (@@autocommit) or a system function (SYSDATE()).
func guardUnsafe(msg string) bool {
	return strings.Contains(msg, "system variable") || strings.Contains(msg, "system function")
}
