package main

import (
	"syscall"
	"time"
)

// sleepUntil sleeps in nanosleep(2), which wakes within tens of
// microseconds: the runtime's timers round a wait under a millisecond up to
// one, which would double a 0.5 ms delay. The goroutine holds its thread
// while it sleeps; the runtime runs the others on other threads.
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(d.Nanoseconds())
		syscall.Nanosleep(&ts, nil)
	}
}
