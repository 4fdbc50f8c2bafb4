package faultproxy

import "time"

// sleepUntil sleeps until t, in naps of at most 10 ms so that a closed done
// ends it early; it reports false if done was closed. A zero t returns at
// once.
func sleepUntil(t time.Time, done <-chan struct{}) bool {
	for {
		select {
		case <-done:
			return false
		default:
		}
		d := time.Until(t)
		if d <= 0 {
			return true
		}
		nap(min(d, 10*time.Millisecond))
	}
}
