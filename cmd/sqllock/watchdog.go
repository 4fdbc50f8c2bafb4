package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// The watchdog ends the command's whole process group when sqllock dies
// without stopping it (SIGKILL, the OOM killer, a crash), so that nothing
// the command started (a script's mysqldump, say) runs on after the lease
// stops being renewed, while another host takes the name. The kernel's
// parent-death signal (see childAttr) reaches only the command itself, not
// what it started; and nothing in sqllock runs once it gets SIGKILL. So a
// second process watches: sqllock run starts itself again as the
// watchdog, holding the write end of a pipe whose read end is the
// watchdog's stdin. When sqllock exits by any means the kernel closes that
// end; the watchdog reads end of file and, unless sqllock told it first
// that the command and its group are done, sends SIGKILL to the group.
//
// It needs no privilege. What it does not reach: a process that left the
// command's process group (setsid, a daemon, a shell's job control), and
// the watchdog itself if it is killed along with sqllock (it runs in a
// process group of its own, so a kill of sqllock's group spares it).

// watchdogCmd is the hidden command name the watchdog runs as.
const watchdogCmd = "_watchdog"

// watchdog is sqllock's side: the pipe to the watchdog process.
type watchdog struct {
	proc *exec.Cmd
	w    *os.File
}

// startWatchdog starts the watchdog, before the command: [watchdog.watch]
// then names the command's process group. Started first, it is running
// by the time the command can start anything; a kill of sqllock between
// the command's start and watch (one write to a pipe) is the only moment
// it misses. An error leaves the command guarded by its parent-death
// signal alone.
func startWatchdog() (*watchdog, error) {
	exe, err := selfPath()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	proc := exec.Command(exe, watchdogCmd)
	proc.Stdin = r
	proc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := proc.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start the watchdog: %w", err)
	}
	return &watchdog{proc: proc, w: w}, nil
}

// selfPath is the path to run this program again: on Linux the running
// binary itself, even if its file was replaced since it started.
func selfPath() (string, error) {
	if runtime.GOOS == "linux" {
		return "/proc/self/exe", nil
	}
	return os.Executable()
}

// watch tells the watchdog the command's process group, pgid.
func (d *watchdog) watch(pgid int) {
	if d == nil {
		return
	}
	_, _ = io.WriteString(d.w, "pgid "+strconv.Itoa(pgid)+"\n")
}

// disarm tells the watchdog the command's group is done with, and waits
// for it to exit.
func (d *watchdog) disarm() {
	if d == nil {
		return
	}
	_, _ = io.WriteString(d.w, "done\n")
	d.w.Close()
	_ = d.proc.Wait()
}

// watchdogMain is the watchdog process: it reads the command's process
// group from sqllock on stdin ("pgid N"), then waits for sqllock's end of
// the pipe to close, and kills that group with SIGKILL unless sqllock said
// "done" first. Closed before it named a group, it has nothing to kill.
func watchdogMain(args []string, stdin io.Reader) int {
	if len(args) != 0 {
		return exitUsage
	}
	// Signals meant for sqllock's terminal or session are not for the
	// watchdog: it ends when sqllock does.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	in := bufio.NewReader(stdin)
	first, _ := in.ReadString('\n')
	rest, ok := strings.CutPrefix(first, "pgid ")
	if !ok {
		return 0 // closed, or done, before a command started
	}
	pgid, err := strconv.Atoi(strings.TrimSuffix(rest, "\n"))
	if err != nil || pgid <= 1 {
		return exitUsage
	}
	if line, _ := in.ReadString('\n'); line == "done\n" {
		return 0
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return 0
}
