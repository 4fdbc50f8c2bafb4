package engine

import "testing"

// The server's facts are asked in each kind's own words, and not of TiDB
// or Vitess, which answer for many servers or refuse every account.
func TestFactsQuery(t *testing.T) {
	for version, want := range map[string]string{
		"10.11.19-MariaDB":   "server_mariadb",
		"9.7.4":              "server_mysql",
		"5.7.44-log":         "server_mysql",
		"8.0.11-TiDB-v9.0.0": "",
		"8.4.6-Vitess":       "",
	} {
		if got := FactsQuery(testQueries, version); got != testQueries[want] {
			t.Errorf("%s: got %q, want %s", version, got, want)
		}
	}
}
