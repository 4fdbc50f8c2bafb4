package mysqlerr

import "testing"

// The errors print as the driver prints a server's: number, SQLSTATE, text.
func TestNew(t *testing.T) {
	if got, want := Deadlock.Error(), "Error 1213 (40001): Deadlock found when trying to get lock; try restarting transaction"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
