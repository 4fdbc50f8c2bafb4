package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// session is the state the signal handler and the start bound share with
// the run.
type session struct {
	mu      sync.Mutex
	pgid    int                     // the child's process group, once started
	got     os.Signal               // the signal that stopped the run before the child started
	expired bool                    // the start bound passed before the child started
	over    bool                    // the wait for the lease is over; the bound no longer applies
	cancel  context.CancelCauseFunc // ends the wait for the lease
}

// errStartBound ends the wait for the lease when the start bound passes.
var errStartBound = errors.New("the server did not answer within the bound on starting the command")

// signal forwards sig to the child's process group, or, before there is a
// child, stops the run.
func (s *session) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pgid != 0 {
		_ = syscall.Kill(-s.pgid, sig.(syscall.Signal))
		return
	}
	if s.got == nil && !s.expired {
		s.got = sig
		s.cancel(fmt.Errorf("got %v", sig))
	}
}

// expire stops the run when the start bound passes before the child has
// started: the server did not answer in time.
func (s *session) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pgid != 0 || s.got != nil || s.over {
		return
	}
	s.expired = true
	s.cancel(errStartBound)
}

// waitOver says the wait for the lease has ended, and reports whether the
// start bound had passed first.
func (s *session) waitOver() (expired bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.over = true
	return s.expired
}

// start starts child in a process group of its own, unless a signal or the
// start bound came first; started reports whether it did.
func (s *session) start(child *exec.Cmd) (started bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got != nil || s.expired {
		return false, nil
	}
	if err := child.Start(); err != nil {
		return false, err
	}
	s.pgid = child.Process.Pid
	return true, nil
}

// signalled returns the signal that stopped the run before the child
// started, if one did.
func (s *session) signalled() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got
}

// kill sends sig to the child's process group.
func (s *session) kill(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = syscall.Kill(-s.pgid, sig)
}

// groupLeft reports whether a process of the child's group is still there,
// once the child has exited, after reaping those that have exited (on
// Linux sqllock adopts them, see adoptOrphans; elsewhere init reaps them).
func (s *session) groupLeft() bool {
	s.mu.Lock()
	pgid := s.pgid
	s.mu.Unlock()
	for {
		pid, err := syscall.Wait4(-pgid, nil, syscall.WNOHANG, nil)
		if err != nil || pid <= 0 {
			break
		}
	}
	// EPERM: there is one, which sqllock may not signal.
	return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

// stopLeftovers stops what the child left running in its process group once
// it has exited (a job's "cmd &"): SIGTERM, and SIGKILL if some of it is
// still there after grace. The lease is released only after this, so that
// nothing the command started runs on while another host may hold the name.
// It returns the signals it sent; none when nothing was left.
func (s *session) stopLeftovers(grace time.Duration) []string {
	if !s.groupLeft() {
		return nil
	}
	s.kill(syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for s.groupLeft() {
		if time.Now().After(deadline) {
			s.kill(syscall.SIGKILL)
			// SIGKILL cannot be caught: wait a moment for it to land, not
			// for a process stuck in the kernel.
			for end := time.Now().Add(time.Second); s.groupLeft() && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
			return []string{"SIGTERM", "SIGKILL"}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return []string{"SIGTERM"}
}
