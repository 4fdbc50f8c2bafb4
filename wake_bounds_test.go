package sqllock

import (
	"database/sql"
	"testing"
	"time"
)

// wantChannelFree checks that nobody holds the channel of name in table. A
// discarded connection's named lock is freed once the server has seen the
// disconnect, a moment later: it waits for that, up to a few seconds.
func wantChannelFree(t *testing.T, db *sql.DB, table, name, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		id := channelHolder(t, db, table, name)
		if id == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("channel of %s %s: held by connection %d, want free", name, when, id)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
