package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Which servers take statements of tens of thousands of leases, by the
// version the first use read: MySQL 8.0 and later, MariaDB 10.5.9 and
// later; the rest the bounds every server takes.
func TestServerForms_largeIn(t *testing.T) {
	for _, tc := range []struct {
		version string
		carries bool
		want    bool
	}{
		{"8.4.3", true, true},
		{"9.7.4-2", true, true},
		{"5.7.44-log", true, false},
		{"10.11.19-MariaDB-0+deb12u1-log", true, true},
		{"5.5.5-10.5.9-MariaDB", true, true},
		{"10.5.8-MariaDB", true, false},
		{"10.4.34-MariaDB-log", true, false},
		{"11.8.9-MariaDB-4 from Debian-log", true, true},
		{"8.0.11-TiDB-v8.4.0", false, false},
		{"8.4.6-Vitess", false, false},
	} {
		f := serverForms(queries, "`t`", "`app`.`t`", "'app'", tc.version, tc.carries)
		if f.LargeIn != tc.want {
			t.Errorf("%s: LargeIn %v, want %v", tc.version, f.LargeIn, tc.want)
		}
	}
}

// renew_many and renew_found, as each server is sent them: the MySQL hint
// on MySQL 8.0 and later alone, MariaDB's prefix on MariaDB 10.5.9 and
// later alone, TiDB's hint on TiDB alone; and the limits that go with
// them.
func TestServer_renewText(t *testing.T) {
	prefix := queries["renew_many_mariadb"] + "\n"
	for _, tc := range []struct {
		version       string
		carries       bool
		hint, mariadb bool
		rows          int
	}{
		{"8.4.3", true, true, false, 34000},
		{"10.11.19-MariaDB", true, false, true, 34000},
		{"10.4.34-MariaDB", true, false, false, 4096},
		{"5.7.44", true, false, false, 4096},
		{"8.0.11-TiDB-v8.4.0", false, false, false, 4096},
	} {
		srv := newTestServer(t, nil, "t")
		srv.Choose(tc.version, "`app`.`t`", "'app'", tc.carries)
		for _, q := range []string{srv.RenewMany(time.Second, []RenewLit{NewRenewLit("a", "t0"), NewRenewLit("b", "t1")}), srv.RenewFoundText([]RenewLit{NewRenewLit("a", "t0")})} {
			if got := strings.Contains(q, sqltext.RangeHint); got != tc.hint {
				t.Errorf("%s: MySQL's hint %v, want %v:\n%s", tc.version, got, tc.hint, q)
			}
			if got := strings.HasPrefix(q, prefix); got != tc.mariadb {
				t.Errorf("%s: MariaDB's prefix %v, want %v:\n%s", tc.version, got, tc.mariadb, q)
			}
			if got, want := strings.Contains(q, sqltext.TiDBHint), strings.Contains(tc.version, "TiDB") && strings.Contains(q, "UPDATE"); got != want {
				t.Errorf("%s: TiDB's hint %v, want %v", tc.version, got, want)
			}
			if !strings.Contains(q, "X'61'") || !strings.Contains(q, "X'743061'") {
				t.Errorf("%s: without the name's literal or its owner's and name's:\n%s", tc.version, q)
			}
		}
		wantBytes := 1 << 20
		if tc.rows > SmallRenewRows {
			wantBytes = 8 << 20
		}
		if rows, bytes := srv.RenewLimits(); rows != tc.rows || bytes != wantBytes {
			t.Errorf("%s: RenewLimits %d rows %d bytes, want %d and %d", tc.version, rows, bytes, tc.rows, wantBytes)
		}
	}
}

// A RenewLit's Bytes is what its row adds to the statement's text: its
// name's literal and its owner's and name's, with their separators; and
// its Key is what renew_found answers for it.
func TestRenewLit(t *testing.T) {
	a := NewRenewLit("lease-0000001", strings.Repeat("a", 32))
	b := NewRenewLit("lease-0000002", strings.Repeat("b", 32))
	n1, p1 := renewLists([]RenewLit{a})
	n2, p2 := renewLists([]RenewLit{a, b})
	if got := len(n2) + len(p2) - len(n1) - len(p1); got != b.Bytes() {
		t.Errorf("the second row adds %d bytes, Bytes says %d", got, b.Bytes())
	}
	if got, want := b.Bytes(), 4*len("lease-0000002")+74; got != want {
		t.Errorf("Bytes %d for a 32-byte owner, want %d", got, want)
	}
	if b.Key != strings.Repeat("b", 32)+"lease-0000002" || b.Name != "X'6c656173652d30303030303032'" || !strings.HasPrefix(b.Pair, "X'6262") {
		t.Errorf("literals %+v", b)
	}
	if n2 != a.Name+", "+b.Name || p2 != a.Pair+", "+b.Pair {
		t.Errorf("lists %q and %q", n2, p2)
	}
}
