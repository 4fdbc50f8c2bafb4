package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// A take of a connection that the pool's counts said was free, but that
// another goroutine took first, gives up within its bound and leaves the
// pool as it was.
func TestServer_connWithin_fullPool(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, table := serverTable(t, s)
		db.SetMaxOpenConns(1)
		srv := newTestServer(t, db, table)
		ctx := testCtx(t)
		held, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		if conn, err := srv.spareConn(ctx, time.Hour); conn != nil || err != nil {
			t.Fatalf("spareConn on a full pool: got %v, %v, want nil, nil at once", conn, err)
		}
		conn, err := srv.connWithin(ctx, time.Millisecond)
		if conn != nil || err != nil {
			t.Fatalf("connWithin on a full pool: got %v, %v, want nil, nil", conn, err)
		}
		if st := db.Stats(); st.InUse != 1 || st.OpenConnections != 1 || st.WaitCount != 1 {
			t.Errorf("pool after: got %+v, want the one connection in use, after one wait", st)
		}
		ended, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := srv.connWithin(ended, time.Hour); !errors.Is(err, context.Canceled) {
			t.Errorf("connWithin with the caller's context ended: got %v, want context.Canceled", err)
		}
	})
}
