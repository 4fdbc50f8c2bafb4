package engine

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The watch for a frozen holder runs only where it can end one (MariaDB,
// MySQL 8.0 or later), once the first use has found the server; elsewhere
// the Server says once, in the log, that it does not end them.
func TestServer_watchFrozen_onlyWhereItCanEnd(t *testing.T) {
	for _, tc := range []struct {
		version string
		carries bool
		watch   bool
	}{
		{"10.11.19-MariaDB", true, true},
		{"9.7.4", true, true},
		{"5.7.44-log", true, false},
		{"8.0.11-TiDB-v9.0.0", false, false},
		{"8.4.6-Vitess", false, false},
	} {
		t.Run(tc.version, func(t *testing.T) {
			srv := newTestServer(t, nil, "sqllock")
			var log bytes.Buffer
			srv.cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
			srv.SetFrozenLook(time.Hour) // no watch runs: there is no server here
			ctx := testCtx(t)
			if w := srv.watchFrozen(ctx, "n"); w != nil {
				w.stop()
				t.Fatal("a watch before the first use has found the server")
			}
			for range 2 {
				srv.chooseForms(tc.version, "`test`.`sqllock`", "'test'", tc.carries)
			}
			w := srv.watchFrozen(ctx, "n")
			if got := w != nil; got != tc.watch {
				t.Errorf("watch: got %v, want %v", got, tc.watch)
			}
			if w.stop() {
				t.Error("stop of a watch that never ran: resend true, want false")
			}
			lines := strings.Count(log.String(), "is not ended on this server")
			if want := map[bool]int{true: 0, false: 1}[tc.watch]; lines != want {
				t.Errorf("log: %d lines saying frozen holders are not ended, want %d:\n%s", lines, want, log.String())
			}
		})
	}
}
