//go:build !race

package sqllock

const raceEnabled = false
