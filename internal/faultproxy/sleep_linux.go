package faultproxy

import (
	"syscall"
	"time"
)

// nap sleeps in nanosleep(2), which wakes within tens of microseconds: the
// runtime's timers round a wait under a millisecond up to one, which would
// double a 0.5 ms latency. The goroutine holds its thread while it sleeps;
// the runtime runs the others on other threads.
func nap(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	syscall.Nanosleep(&ts, nil)
}
