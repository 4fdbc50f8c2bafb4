package main

import "syscall"

// childAttr puts the child in a process group of its own, so that a lost
// lease kills everything it started, and has the kernel kill it should
// sqllock die first (SIGKILL, the OOM killer): it must not outlive the
// keep-alive that guards its lease.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
