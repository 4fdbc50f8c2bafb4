package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses: a history the model rejects, bad usage or an unreadable
// file, and a check that ran out of time.
const (
	exitIllegal = 1
	exitUsage   = 2
	exitUnknown = 3
)

// run is the command; it returns the exit status: 0 when every history is
// linearizable.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("linearize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", time.Minute, "give up on a history after this long, with the verdict unknown (exit status 3)")
	slack := fs.Duration("slack", time.Millisecond, "how far the clocks of the processes and the server may disagree")
	viz := fs.String("viz", "", "where to write porcupine's visualization of a history the model rejects or could not decide (default: the history's path with .html added)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: linearize [flags] HISTORY...\n\nChecks each history that sqllock-stress -history wrote against a model of the lock and its register.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 || *timeout <= 0 || *slack < 0 || *viz != "" && fs.NArg() > 1 {
		fs.Usage()
		return exitUsage
	}
	status := 0
	for _, path := range fs.Args() {
		out := *viz
		if out == "" {
			out = path + ".html"
		}
		s, err := checkFile(path, out, *timeout, *slack, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "linearize: %s: %v\n", path, err)
			return exitUsage
		}
		status = max(status, s)
	}
	return status
}

// checkFile checks the history in path and prints its verdict; when the
// verdict is not linearizable, it writes the visualization to viz.
func checkFile(path, viz string, timeout, slack time.Duration, stdout io.Writer) (status int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h, err := readHistory(f)
	if err != nil {
		return 0, err
	}
	if len(h.ops) == 0 {
		return 0, errors.New("no operation to check: was the run given -history?")
	}
	model := newModel(slack.Nanoseconds())
	began := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, h.ops, timeout)
	took := time.Since(began)
	fmt.Fprintf(stdout, "linearize: %s: %d operations on %d names checked (%d of unknown outcome; %d refusals and rolled-back writes of %d not checked)\n",
		path, len(h.ops), len(h.names), h.unknown, h.skipped, h.lines)
	switch res {
	case porcupine.Ok:
		fmt.Fprintf(stdout, "linearize: linearizable (%.2fs)\n", took.Seconds())
		return 0, nil
	case porcupine.Illegal:
		fmt.Fprintf(stdout, "linearize: NOT LINEARIZABLE (%.2fs): names %q\n", took.Seconds(), illegalNames(model, h.ops, timeout))
		status = exitIllegal
	default:
		fmt.Fprintf(stdout, "linearize: UNKNOWN: no verdict within -timeout %v\n", timeout)
		status = exitUnknown
	}
	if err := porcupine.VisualizePath(model, info, viz); err != nil {
		return status, fmt.Errorf("visualization: %w", err)
	}
	fmt.Fprintf(stdout, "linearize: visualization in %s\n", viz)
	return status, nil
}

// illegalNames checks each name's operations alone and returns the names
// whose history the model rejects.
func illegalNames(model porcupine.Model, ops []porcupine.Operation, timeout time.Duration) []string {
	var bad []string
	for _, part := range model.Partition(ops) {
		if porcupine.CheckOperationsTimeout(model, part, timeout) == porcupine.Illegal {
			bad = append(bad, part[0].Input.(op).Name)
		}
	}
	slices.Sort(bad)
	return bad
}
