package main

import "syscall"

// childAttr puts the child in a process group of its own, so that a lost
// lease kills everything it started, and has the kernel kill it should
// sqllock die first (SIGKILL, the OOM killer): it must not outlive the
// keep-alive that guards its lease.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2).
const prSetChildSubreaper = 36

// adoptOrphans makes sqllock, not init, the parent of what the command
// leaves running when it exits, so that sqllock reaps what it stops and
// sees at once that the command's process group is empty: where init does
// not reap (a container's), a stopped process would stay a zombie, still
// a member of the group. It is best effort: if prctl fails, sqllock waits
// the kill grace out for such zombies instead.
func adoptOrphans() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}
