// Command sqllock runs a command under a sqllock lease, so that a cron job
// installed on several hosts runs on one at a time, and lets operators look
// after the lock table without writing SQL.
//
//	sqllock run [flags] NAME [flags] -- COMMAND [ARGS...]
//	sqllock list [--json]
//	sqllock inspect [--json] NAME
//	sqllock release --force [--json] [--slot K] [--lock-delay DURATION] NAME
//	sqllock once-reset [--json] NAME
//	sqllock create-table [--json]
//	sqllock metrics [--listen ADDR] [--expect-held NAME]...
//
// Flags may stand before or after the operands, up to "--"; what follows
// "--" is run's COMMAND, untouched. The server comes from --dsn or
// SQLLOCK_DSN (a go-sql-driver/mysql DSN such as user:pass@tcp(db:3306)/app);
// --table picks the table (default sqllock); --timeout (default 10s) bounds
// the wait for the server to answer. See docs/operations.md for run's exit
// statuses.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
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
  sqllock list [--json]                            every live lease, and every held slot of a semaphore
  sqllock inspect [--json] NAME                    the lease on NAME, or the slots of the semaphore NAME
  sqllock release --force [--json] NAME            take the lease on NAME from whoever holds it
                                                   (--slot K: slot K of the semaphore NAME;
                                                   --lock-delay: how long nobody may take it after)
  sqllock once-reset [--json] NAME                 let Client.Once run NAME again
  sqllock create-table [--json]                    create the lock table if it is missing
  sqllock metrics [--listen :9187]                 serve the lock table as Prometheus metrics
                                                   (--expect-held NAME: a name that must always be held)
Every command takes --dsn (default $SQLLOCK_DSN), --table (default sqllock) and
--timeout (default 10s: how long to wait for the server to answer). Flags may
stand before or after NAME; everything after -- is the COMMAND.
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
	case "metrics":
		return metricsCmd(ctx, args, stderr)
	case watchdogCmd:
		return watchdogMain(args, os.Stdin)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sqllock: unknown command %q\n%s", cmd, usage)
	return exitUsage
}

// common are the flags of every command.
type common struct {
	dsn     string
	table   string
	timeout time.Duration
	limits  *serverLimits // set by open
}

func (c *common) register(fs *flag.FlagSet) {
	// The environment is read in open, not shown as a default: help must
	// not print a password.
	fs.StringVar(&c.dsn, "dsn", "", "go-sql-driver/mysql `DSN` of the server (default $SQLLOCK_DSN)")
	fs.StringVar(&c.table, "table", sqllock.DefaultTable, "lock `table`")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "give up when the server does not accept a connection or answer within `DURATION`")
}

// check reports what is wrong with the common flags.
func (c *common) check() error {
	if c.timeout <= 0 {
		return fmt.Errorf("--timeout %v: must be above 0", c.timeout)
	}
	return nil
}

// open opens the database and a Client on it. Each read and write of its
// connections is bounded by io unless the DSN bounds them itself, and each
// dial by --timeout. Options come after the table's.
func (c *common) open(io limit, opts ...sqllock.Option) (*sql.DB, *sqllock.Client, error) {
	from := "--dsn"
	if c.dsn == "" {
		c.dsn, from = os.Getenv("SQLLOCK_DSN"), "SQLLOCK_DSN"
	}
	if c.dsn == "" {
		return nil, nil, errors.New("no server: set --dsn or SQLLOCK_DSN (for example " + dsnForm + ")")
	}
	cfg, err := parseDSN(c.dsn, from)
	if err != nil {
		return nil, nil, err
	}
	c.limits = setLimits(cfg, c.timeout, io)
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w; a DSN reads %s", from, err, dsnForm)
	}
	db := sql.OpenDB(connector)
	client, err := sqllock.New(db, append([]sqllock.Option{sqllock.WithTable(c.table)}, opts...)...)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, client, nil
}

// dsnForm is what a DSN looks like, for the messages about one that does not.
const dsnForm = "user:password@tcp(host:3306)/dbname"

// urlScheme matches the start of a URL: what people write for other
// drivers (mysql://user@host:3306/db), which go-sql-driver/mysql reads as
// a user and a network it does not know.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// parseDSN parses dsn, which came from from (--dsn or SQLLOCK_DSN). Its
// errors say what a DSN looks like, and never repeat dsn, which may hold a
// password.
func parseDSN(dsn, from string) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	switch {
	case err == nil:
		return cfg, nil
	case urlScheme.MatchString(dsn):
		scheme, _, _ := strings.Cut(dsn, "://")
		return nil, fmt.Errorf("%s is a URL (%s://...), which go-sql-driver/mysql does not read: write it as %s", from, scheme, dsnForm)
	}
	return nil, fmt.Errorf("%s: %w; a DSN reads %s", from, err, dsnForm)
}

// errText words an error of the library for the command's message: without
// the library's "sqllock: " (the command says it once, at the start of the
// line), without the library's name of the operation when the command's
// message names it already (op, if not ""), and naming sqllock create-table
// where the library names Client.CreateTable.
func (c *common) errText(err error, op string) string {
	msg := unprefix(err.Error())
	if op != "" {
		msg = strings.TrimPrefix(msg, op+": ")
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && myErr.Number == erNoSuchTable {
		create := "sqllock create-table"
		if c.table != sqllock.DefaultTable {
			create += " --table " + c.table
		}
		if strings.Contains(msg, "Client.CreateTable") {
			msg = strings.Replace(msg, "Client.CreateTable", create, 1)
		} else {
			msg += "; create it with " + create
		}
	}
	return msg
}

// erNoSuchTable is the server's error for a missing table.
const erNoSuchTable = 1146

// adminCmd runs the operator commands.
func adminCmd(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	var (
		co        common
		jsonOut   bool
		force     bool
		slot      int
		lockDelay lockDelayFlag
		wantArgs  = 1
	)
	fs := newFlagSet(cmd)
	co.register(fs)
	fs.BoolVar(&jsonOut, "json", false, "print JSON, for scripts")
	switch cmd {
	case "release":
		fs.BoolVar(&force, "force", false, "required: take the lease from whoever holds it")
		fs.IntVar(&slot, "slot", 0, fmt.Sprintf("take slot `K` (1 to %d) of the semaphore NAME instead of the lease on NAME", sqllock.MaxSlots))
		lockDelay.register(fs)
	case "list", "create-table":
		wantArgs = 0
	}
	pos, rest, _, err := parseArgs(fs, args, 0, stderr)
	if err != nil {
		return usageStatus(err)
	}
	// After "--" come operands only: a NAME that starts with '-'.
	pos = append(pos, rest...)
	header := "sqllock " + cmd
	switch {
	case len(pos) == 0 && wantArgs == 1:
		fmt.Fprintf(stderr, "%s: no NAME given\n%s", header, usage)
		return exitUsage
	case len(pos) != wantArgs:
		fmt.Fprintf(stderr, "%s: got %d arguments (%s), want %d\n%s", header, len(pos), quoteArgs(pos), wantArgs, usage)
		return exitUsage
	case cmd == "release" && !force:
		fmt.Fprintln(stderr, "sqllock release: --force is required: it takes the lease from whoever holds it, and that holder's work goes on until its next renewal")
		return exitUsage
	case slot < 0 || slot > sqllock.MaxSlots:
		fmt.Fprintf(stderr, "sqllock release: --slot %d: a semaphore's slots are 1 to at most %d\n", slot, sqllock.MaxSlots)
		return exitUsage
	}
	if err := co.check(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", header, err)
		return exitUsage
	}
	db, client, err := co.open(limit{co.timeout, "--timeout"}, lockDelay.options()...)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", header, unprefix(err.Error()))
		return exitUsage
	}
	defer db.Close()
	defer client.Close()
	// One bound for the whole command: each makes one call to the library.
	deadline := time.Now().Add(co.timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	out := &printer{w: stdout, json: jsonOut}
	var op string // the library's name of the operation, said by header
	switch cmd {
	case "list":
		op = "list"
		err = listCmd(ctx, client, out)
	case "inspect":
		header, op = header+" "+pos[0], fmt.Sprintf("inspect %q", pos[0])
		err = inspectCmd(ctx, client, pos[0], out)
	case "release":
		header, op = header+" "+pos[0], fmt.Sprintf("force release %q", pos[0])
		if slot > 0 {
			op = fmt.Sprintf("force release slot %d of the semaphore %q", slot, pos[0])
		}
		err = releaseCmd(ctx, client, pos[0], slot, out)
	case "once-reset":
		header, op = header+" "+pos[0], fmt.Sprintf("reset once %q", pos[0])
		err = onceResetCmd(ctx, client, pos[0], out)
	case "create-table":
		op = "create table `" + co.table + "`"
		err = createTableCmd(ctx, client, co.table, out)
	}
	var usageErr usageError
	if errors.As(err, &usageErr) {
		fmt.Fprintf(stderr, "%s: %v\n", header, usageErr)
		return exitUsage
	}
	if err != nil {
		msg := co.errText(err, op)
		ended := ctx.Err() != nil || !time.Now().Before(deadline)
		if why := co.limits.noAnswer(err, ended, fmt.Sprintf("--timeout %v", co.timeout)); why != "" {
			msg = withDetail(why, err, msg)
		}
		fmt.Fprintf(stderr, "%s: %s\n", header, msg)
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
	// Slot is a semaphore's slot's number; Name is then the semaphore's
	// and Fence its fence.
	Slot int `json:"slot,omitempty"`
	// MinHold, from inspect, says that the live lease is what a release
	// with a minimum hold left: its holder's run has ended.
	MinHold bool `json:"min_hold,omitempty"`
}

// inspected is how inspect prints NAME in JSON: its lease, and the slots
// of the semaphore NAME, if it is one.
type inspected struct {
	lease
	Slots []lease `json:"slots,omitempty"`
}

func leaseOf(info sqllock.Info) lease {
	return lease{Name: info.Name, Holder: info.Holder, Fence: info.Fence, Held: info.Held, TTL: info.TTL.Seconds(), Slot: info.Slot, MinHold: info.MinHold}
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\n", listName(info), info.Holder, info.Fence, roundTTL(info.TTL))
	}
	return tw.Flush()
}

// inspectCmd shows the lease on NAME, and the slots of the semaphore NAME
// when there is one (the two share no rows): the lock alone when both were
// never taken.
func inspectCmd(ctx context.Context, c *sqllock.Client, name string, out *printer) error {
	info, err := c.Inspect(ctx, name)
	if err != nil {
		return err
	}
	slots, err := semaphoreSlots(ctx, c, name)
	if err != nil {
		return err
	}
	if out.json {
		l := inspected{lease: leaseOf(info)}
		for _, s := range slots {
			l.Slots = append(l.Slots, leaseOf(s))
		}
		out.printJSON(l)
		return nil
	}
	if len(slots) == 0 || info.Fence != 0 {
		fmt.Fprintf(out.w, "%s: %s\n", name, lockText(info))
	}
	printSlots(out.w, name, slots)
	return nil
}

// lockText says what inspect found on a lock's name.
func lockText(info sqllock.Info) string {
	switch {
	case info.Held && isLockDelay(info):
		return fmt.Sprintf("under a %s, fence %d: nobody can take it for %v", info.Holder, info.Fence, roundTTL(info.TTL))
	case info.MinHold:
		return fmt.Sprintf("released by %s, whose run has ended; its minimum hold keeps the name taken, fence %d: free in %v", info.Holder, info.Fence, roundTTL(info.TTL))
	case info.Held:
		return fmt.Sprintf("held by %s, fence %d, %v left", info.Holder, info.Fence, roundTTL(info.TTL))
	case info.Fence == 0:
		return "free, never taken"
	case info.Holder != "":
		return fmt.Sprintf("free (the lease of %s expired), last fence %d", info.Holder, info.Fence)
	}
	return fmt.Sprintf("free, last fence %d", info.Fence)
}

func createTableCmd(ctx context.Context, c *sqllock.Client, table string, out *printer) error {
	if err := c.CreateTable(ctx); err != nil {
		return err
	}
	if out.json {
		out.printJSON(struct {
			Table  string `json:"table"`
			Exists bool   `json:"exists"`
		}{table, true})
		return nil
	}
	fmt.Fprintf(out.w, "table %s is there\n", table)
	return nil
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
