package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
)

// defaultTimeout is --timeout: how long a command waits for the server to
// accept a connection and to answer. A server that answers at all answers
// sqllock's one-row statements in milliseconds; ten seconds leave room for a
// loaded server, TLS and a first connection's checks, and a cron job that
// fires every minute still cannot pile up hung processes.
const defaultTimeout = 10 * time.Second

// A limit is a bound on waiting for the server, and what set it, for the
// messages that say it passed.
type limit struct {
	d    time.Duration
	from string // "--timeout", "the DSN's readTimeout", ...
}

// String says the bound as the message of a command's own bound does when
// a flag set it ("--timeout 10s"), so that the two read the same when both
// end at once (run's read bound and its start bound, by default); else the
// bound, then what set it.
func (l limit) String() string {
	if strings.HasPrefix(l.from, "--") {
		return fmt.Sprintf("%s %v", l.from, l.d)
	}
	return fmt.Sprintf("%v (%s)", l.d, l.from)
}

// serverLimits are the driver's bounds on each dial, read and write of a
// command's connections. It is also the driver's logger, which is how it
// learns that a read or write was cut by its deadline: the driver then
// returns only "invalid connection".
type serverLimits struct {
	addr              string
	dial, read, write limit

	mu       sync.Mutex
	timedOut string // "read" or "write": the last I/O cut by its deadline
}

// setLimits puts the bounds of a command into cfg, where the DSN does not
// set its own: --timeout for the dial, and io for each read and write.
func setLimits(cfg *mysql.Config, timeout time.Duration, io limit) *serverLimits {
	sl := &serverLimits{addr: cfg.Addr}
	sl.dial = fromDSN(&cfg.Timeout, limit{timeout, "--timeout"}, "timeout")
	sl.read = fromDSN(&cfg.ReadTimeout, io, "readTimeout")
	sl.write = fromDSN(&cfg.WriteTimeout, io, "writeTimeout")
	cfg.Logger = sl
	return sl
}

// fromDSN sets *d to def.d unless the DSN's parameter param set it.
func fromDSN(d *time.Duration, def limit, param string) limit {
	if *d > 0 {
		return limit{*d, "the DSN's " + param}
	}
	*d = def.d
	return def
}

// Print is the driver's logger. Its lines are dropped: the errors that
// matter reach sqllock, which reports them. A read or write that timed out
// is remembered, to say so.
func (sl *serverLimits) Print(v ...any) {
	for _, x := range v {
		err, ok := x.(error)
		var opErr *net.OpError
		if ok && errors.As(err, &opErr) && opErr.Timeout() && (opErr.Op == "read" || opErr.Op == "write") {
			sl.mu.Lock()
			sl.timedOut = opErr.Op
			sl.mu.Unlock()
		}
	}
}

// noAnswer says, when err came from the server not answering in time, which
// bound passed: the command's own (ended true; bound names it), a dial's,
// or a read's or write's. It returns "" for other errors.
func (sl *serverLimits) noAnswer(err error, ended bool, bound string) string {
	if err == nil {
		return ""
	}
	if ended {
		return fmt.Sprintf("the server at %s did not answer within %s", sl.addr, bound)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" && opErr.Timeout() {
		return fmt.Sprintf("the server at %s did not accept a connection within %v", sl.addr, sl.dial)
	}
	if !errors.Is(err, mysql.ErrInvalidConn) && !errors.Is(err, driver.ErrBadConn) {
		return ""
	}
	sl.mu.Lock()
	op := sl.timedOut
	sl.mu.Unlock()
	switch op {
	case "read":
		return fmt.Sprintf("the server at %s did not answer within %v", sl.addr, sl.read)
	case "write":
		return fmt.Sprintf("the server at %s did not take a statement within %v", sl.addr, sl.write)
	}
	return ""
}

// withDetail joins the message of noAnswer and the error's own text, unless
// that only says the call was cut.
func withDetail(why string, err error, msg string) string {
	if onlyCut(err) {
		return why
	}
	return fmt.Sprintf("%s (%s)", why, msg)
}

// onlyCut reports whether err says nothing but that calls were cut: each
// error at the end of its chains is a context's end, a connection the driver
// gave up on, or a sentinel of sqllock.
func onlyCut(err error) bool {
	switch e := err.(type) {
	case nil:
		return true
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if !onlyCut(inner) {
				return false
			}
		}
		return true
	case interface{ Unwrap() error }:
		return onlyCut(e.Unwrap())
	}
	for _, cut := range []error{context.Canceled, context.DeadlineExceeded, mysql.ErrInvalidConn, driver.ErrBadConn,
		sqllock.ErrNotAcquired, sqllock.ErrNotHeld} {
		if err == cut {
			return true
		}
	}
	return false
}
