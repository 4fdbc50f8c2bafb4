package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// newFlagSet returns a flag set that keeps its own error messages to
// itself: parseArgs says what went wrong, prefixed with the command.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sqllock "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseArgs parses the flags of fs wherever they stand among a command's
// operands, so that "inspect NAME --json" and "run NAME --wait 5m -- job"
// mean what they say. Parsing stops at the first "--", and, when
// maxOperands is above 0 and no "--" comes later, at the first operand past
// the maxOperands-th: the words from there on are rest, untouched (run's
// COMMAND). When a "--" does come later, the words before it are operands,
// too many, for the caller to refuse. dashdash reports whether "--" ended
// the flags.
//
// On a bad flag it writes "sqllock NAME: the problem" to stderr and returns
// the error; on -h or -help it writes fs's usage and returns
// [flag.ErrHelp].
func parseArgs(fs *flag.FlagSet, args []string, maxOperands int, stderr io.Writer) (operands, rest []string, dashdash bool, err error) {
	var flags []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return operands, args[i+1:], true, parseFlags(fs, flags, stderr)
		case len(a) > 1 && a[0] == '-':
			flags = append(flags, a)
			if takesValue(fs, a) && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		case maxOperands > 0 && len(operands) == maxOperands:
			if n := slices.Index(args[i:], "--"); n >= 0 {
				// "--" comes later: it is the one that ends the flags,
				// and these words stand where only flags may.
				operands = append(operands, args[i:i+n]...)
				return operands, args[i+n+1:], true, parseFlags(fs, flags, stderr)
			}
			return operands, args[i:], false, parseFlags(fs, flags, stderr)
		default:
			operands = append(operands, a)
		}
	}
	return operands, nil, false, parseFlags(fs, flags, stderr)
}

// parseFlags parses flags, which holds only flags and their values, and
// says on stderr what is wrong with them.
func parseFlags(fs *flag.FlagSet, flags []string, stderr io.Writer) error {
	err := fs.Parse(flags)
	switch {
	case err == nil && fs.NArg() > 0:
		// Cannot happen: every word of flags is a flag or a flag's value.
		err = fmt.Errorf("unexpected %q", fs.Args())
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stderr)
		fs.Usage()
		return err
	case err == nil:
		return nil
	}
	fmt.Fprintf(stderr, "%s: %v\nRun %q for its flags.\n", fs.Name(), err, fs.Name()+" -h")
	return err
}

// takesValue reports whether the flag word a is fs's flag that takes its
// value from the next word: not a boolean flag, and no "=value" in a.
func takesValue(fs *flag.FlagSet, a string) bool {
	name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false // fs.Parse names it as unknown
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return false
	}
	return true
}

// usageStatus is the exit status after a flag error: 0 for -h.
func usageStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return exitUsage
}
