package testdsn

import (
	"reflect"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		value  string
		labels []string
		dsns   []string
	}{
		{"root@tcp(127.0.0.1:3306)/test", []string{""}, []string{"root@tcp(127.0.0.1:3306)/test"}},
		{"a=root@tcp(h:1)/test", []string{"a"}, []string{"root@tcp(h:1)/test"}},
		{"mariadb-10.11=root@tcp(h:1)/test,mysql-9.7=root@tcp(h:2)/test",
			[]string{"mariadb-10.11", "mysql-9.7"}, []string{"root@tcp(h:1)/test", "root@tcp(h:2)/test"}},
		{"root@tcp(h:1)/test,b=root@tcp(h:2)/test", []string{"", "b"}, []string{"root@tcp(h:1)/test", "root@tcp(h:2)/test"}},
		// A comma inside a DSN is not a cut: no label follows it.
		{"root@tcp(h:1)/test?sql_mode='A,B'&x=1", []string{""}, []string{"root@tcp(h:1)/test?sql_mode='A,B'&x=1"}},
		{"u:p,w@tcp(h:1)/test, x=root@tcp(h:2)/test", []string{"", "x"}, []string{"u:p,w@tcp(h:1)/test", "root@tcp(h:2)/test"}},
		{"", nil, nil},
	} {
		labels, dsns := Split(tc.value)
		if !reflect.DeepEqual(labels, tc.labels) || !reflect.DeepEqual(dsns, tc.dsns) {
			t.Errorf("Split(%q): got %q %q, want %q %q", tc.value, labels, dsns, tc.labels, tc.dsns)
		}
	}
}

func TestLabel(t *testing.T) {
	for version, want := range map[string]string{
		"10.11.19-MariaDB-0+deb12u1":   "mariadb-10.11",
		"11.8.9-MariaDB-4 from Debian": "mariadb-11.8",
		"9.7.4-2":                      "mysql-9.7",
		"8.0.36":                       "mysql-8.0",
		"5.7.44-log":                   "mysql-5.7",
		"8.0.11-TiDB-v8.4.0":           "tidb-8.4",
	} {
		if got := Label(version); got != want {
			t.Errorf("Label(%q): got %q, want %q", version, got, want)
		}
	}
}
