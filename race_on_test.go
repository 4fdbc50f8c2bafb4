//go:build race

package sqllock

// raceEnabled: the race detector drops sync.Pool's items at random, so
// allocation counts vary from run to run.
const raceEnabled = true
