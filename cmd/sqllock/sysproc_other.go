//go:build unix && !linux

package main

import "syscall"

// childAttr puts the child in a process group of its own, so that a lost
// lease kills everything it started.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// adoptOrphans does nothing: init reaps what the command leaves behind.
func adoptOrphans() {}
