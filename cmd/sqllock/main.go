// Command sqllock runs a command under a sqllock lease, so that a cron job
// installed on several hosts runs on one at a time, and lets operators look
// after the lock table without writing SQL.
//
//	sqllock run [flags] NAME -- COMMAND [ARGS...]
//	sqllock list [--json]
//	sqllock inspect [--json] NAME
//	sqllock release --force [--json] NAME
//	sqllock once-reset [--json] NAME
//	sqllock create-table
//
// The server comes from --dsn or SQLLOCK_DSN (a go-sql-driver/mysql DSN such
// as user:pass@tcp(db:3306)/app); --table picks the table (default sqllock).
// See docs/operations.md for run's exit statuses.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
)

// Exit statuses of sqllock itself. run otherwise exits with its child's.
const (
	exitFailure  = 1   // an operator command failed
	exitUsage    = 64  // EX_USAGE: bad flags or arguments
	exitConflict = 75  // EX_TEMPFAIL: another holder has the name (--conflict-exit-code)
	exitLost     = 124 // the lease was lost while the command ran; it was killed
	exitOwn      = 125 // run failed on its own account (server, table), the command did not run
	exitNoExec   = 126 // the command was found but could not be started
	exitNotFound = 127 // the command was not found
)

const usage = `usage:
  sqllock run [flags] NAME -- COMMAND [ARGS...]   run COMMAND while holding the lease on NAME
  sqllock list [--json]                            every live lease
  sqllock inspect [--json] NAME                    the lease on NAME
  sqllock release --force [--json] NAME            delete the lease on NAME, whoever holds it
  sqllock once-reset [--json] NAME                 let Client.Once run NAME again
  sqllock create-table                             create the lock table if it is missing
Every command takes --dsn (default $SQLLOCK_DSN) and --table (default sqllock).
Run "sqllock COMMAND -h" for its flags.
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "run":
		return runCmd(ctx, args, stderr)
	case "list", "inspect", "release", "once-reset", "create-table":
		return adminCmd(ctx, cmd, args, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sqllock: unknown command %q\n%s", cmd, usage)
	return exitUsage
}

// common are the flags of every command.
type common struct {
	dsn   string
	table string
}

func (c *common) register(fs *flag.FlagSet) {
	// The environment is read in open, not shown as a default: help must
	// not print a password.
	fs.StringVar(&c.dsn, "dsn", "", "go-sql-driver/mysql `DSN` of the server (default $SQLLOCK_DSN)")
	fs.StringVar(&c.table, "table", sqllock.DefaultTable, "lock `table`")
}

// open opens the database and a Client on it. Options come after the table's.
func (c *common) open(opts ...sqllock.Option) (*sql.DB, *sqllock.Client, error) {
	if c.dsn == "" {
		c.dsn = os.Getenv("SQLLOCK_DSN")
	}
	if c.dsn == "" {
		return nil, nil, errors.New("no server: set --dsn or SQLLOCK_DSN (for example user:pass@tcp(db:3306)/app)")
	}
	cfg, err := mysql.ParseDSN(c.dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("--dsn: %w", err)
	}
	// The driver logs broken connections on its own; the errors that
	// matter reach sqllock, which reports them.
	cfg.Logger = log.New(io.Discard, "", 0)
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("--dsn: %w", err)
	}
	db := sql.OpenDB(connector)
	client, err := sqllock.New(db, append([]sqllock.Option{sqllock.WithTable(c.table)}, opts...)...)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, client, nil
}

// newFlagSet returns a flag set that writes its errors and help to stderr.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sqllock "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseInterspersed parses flags wherever they stand among the positional
// arguments, which it returns, so that "inspect NAME --json" works too.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// usageStatus is the exit status after a flag error: 0 for -h.
func usageStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return exitUsage
}

// adminCmd runs the operator commands.
func adminCmd(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	var (
		co       common
		jsonOut  bool
		force    bool
		wantArgs = 1
	)
	fs := newFlagSet(cmd, stderr)
	co.register(fs)
	if cmd != "create-table" {
		fs.BoolVar(&jsonOut, "json", false, "print JSON, for scripts")
	}
	switch cmd {
	case "release":
		fs.BoolVar(&force, "force", false, "required: delete the lease whoever holds it")
	case "list", "create-table":
		wantArgs = 0
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return usageStatus(err)
	}
	if len(pos) != wantArgs {
		fmt.Fprintf(stderr, "sqllock %s: got %d arguments, want %d\n%s", cmd, len(pos), wantArgs, usage)
		return exitUsage
	}
	if cmd == "release" && !force {
		fmt.Fprintln(stderr, "sqllock release: --force is required: it deletes the lease whoever holds it, and that holder's work goes on until its next renewal")
		return exitUsage
	}
	db, client, err := co.open()
	if err != nil {
		fmt.Fprintf(stderr, "sqllock %s: %s\n", cmd, unprefix(err.Error()))
		return exitUsage
	}
	defer db.Close()
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	out := &printer{w: stdout, json: jsonOut}
	switch cmd {
	case "list":
		err = listCmd(ctx, client, out)
	case "inspect":
		err = inspectCmd(ctx, client, pos[0], out)
	case "release":
		err = releaseCmd(ctx, client, pos[0], out)
	case "once-reset":
		err = onceResetCmd(ctx, client, pos[0], out)
	case "create-table":
		if err = client.CreateTable(ctx); err == nil {
			fmt.Fprintf(stdout, "table %s is there\n", co.table)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "sqllock %s: %s\n", cmd, unprefix(err.Error()))
		return exitFailure
	}
	return out.err
}

// lease is how the operator commands print a lease in JSON.
type lease struct {
	Name   string `json:"name"`
	Holder string `json:"holder"`
	Fence  uint64 `json:"fence"`
	Held   bool   `json:"held"`
	// TTL is the time the lease has left, in seconds; 0 when not held.
	TTL float64 `json:"ttl_seconds"`
}

func leaseOf(info sqllock.Info) lease {
	return lease{Name: info.Name, Holder: info.Holder, Fence: info.Fence, Held: info.Held, TTL: info.TTL.Seconds()}
}

// printer writes either JSON or text for people.
type printer struct {
	w    io.Writer
	json bool
	err  int // exit status after a failed write
}

func (p *printer) printJSON(v any) {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		p.err = exitFailure
	}
}

func listCmd(ctx context.Context, c *sqllock.Client, out *printer) error {
	infos, err := c.List(ctx)
	if err != nil {
		return err
	}
	if out.json {
		leases := make([]lease, 0, len(infos))
		for _, info := range infos {
			leases = append(leases, leaseOf(info))
		}
		out.printJSON(leases)
		return nil
	}
	tw := tabwriter.NewWriter(out.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHOLDER\tFENCE\tLEFT")
	for _, info := range infos {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\n", info.Name, info.Holder, info.Fence, roundTTL(info.TTL))
	}
	return tw.Flush()
}

func inspectCmd(ctx context.Context, c *sqllock.Client, name string, out *printer) error {
	info, err := c.Inspect(ctx, name)
	if err != nil {
		return err
	}
	if out.json {
		out.printJSON(leaseOf(info))
		return nil
	}
	switch {
	case info.Held:
		fmt.Fprintf(out.w, "%s: held by %s, fence %d, %v left\n", name, info.Holder, info.Fence, roundTTL(info.TTL))
	case info.Fence == 0:
		fmt.Fprintf(out.w, "%s: free, never taken\n", name)
	case info.Holder != "":
		fmt.Fprintf(out.w, "%s: free (the lease of %s expired), last fence %d\n", name, info.Holder, info.Fence)
	default:
		fmt.Fprintf(out.w, "%s: free, last fence %d\n", name, info.Fence)
	}
	return nil
}

func releaseCmd(ctx context.Context, c *sqllock.Client, name string, out *printer) error {
	info, err := c.ForceRelease(ctx, name)
	released := err == nil
	if errors.Is(err, sqllock.ErrNotHeld) {
		err = nil
	}
	if err != nil {
		return err
	}
	if out.json {
		out.printJSON(struct {
			Released bool   `json:"released"`
			Was      *lease `json:"was,omitempty"`
		}{released, leaseOrNil(released, info)})
		return nil
	}
	switch {
	case !released:
		fmt.Fprintf(out.w, "%s: no lease to release\n", name)
	case info.Held:
		fmt.Fprintf(out.w, "%s: released the lease of %s (fence %d, %v left)\n", name, info.Holder, info.Fence, roundTTL(info.TTL))
	default:
		fmt.Fprintf(out.w, "%s: released the expired lease of %s (fence %d)\n", name, info.Holder, info.Fence)
	}
	return nil
}

func leaseOrNil(ok bool, info sqllock.Info) *lease {
	if !ok {
		return nil
	}
	l := leaseOf(info)
	return &l
}

func onceResetCmd(ctx context.Context, c *sqllock.Client, name string, out *printer) error {
	reset, err := c.ResetOnce(ctx, name)
	if err != nil {
		return err
	}
	if out.json {
		out.printJSON(struct {
			Reset bool `json:"reset"`
		}{reset})
		return nil
	}
	if reset {
		fmt.Fprintf(out.w, "%s: completion record deleted; the next Once runs again\n", name)
	} else {
		fmt.Fprintf(out.w, "%s: no completion record\n", name)
	}
	return nil
}

// unprefix drops the library's "sqllock: " from the messages of its errors:
// the command says it once, at the start of the line.
func unprefix(msg string) string {
	return strings.ReplaceAll(msg, "sqllock: ", "")
}

// roundTTL rounds a lease's time left for people.
func roundTTL(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// quoteArgs shows a command line for messages.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
			a = fmt.Sprintf("%q", a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}
