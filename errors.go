package sqllock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// Errors compared with [errors.Is]. An error that wraps one of them says
// more about what happened (which name, which driver error).
var (
	// ErrNotAcquired means another owner holds a live lease on the name.
	ErrNotAcquired = errors.New("sqllock: not acquired")
	// ErrNotHeld means the lease is no longer this Lock's: it expired and
	// someone else took the name over, or it was already released.
	ErrNotHeld = errors.New("sqllock: not held")
	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("sqllock: client closed")
)

// ErrLockLost means a lease ended while work ran under it: someone took the
// name over, or no renewal succeeded before the lease could expire. It is
// the cause (see [context.Cause]) of a context from [Lock.KeepAlive] that
// ended because of loss, and [Client.Do] returns it wrapped.
var ErrLockLost = errors.New("sqllock: lock lost")

// ErrBadTable means the Client's table differs from schema.sql, at first
// use or after an ALTER TABLE; the error that wraps it names each
// difference and the ALTER TABLE that mends them.
var ErrBadTable = errors.New("sqllock: table does not match schema.sql")

// ErrSlotCount means a semaphore was asked for with another n than it has
// while a slot is held; the error that wraps it names both, and also wraps
// [ErrNotAcquired].
var ErrSlotCount = errors.New("sqllock: the semaphore has another number of slots")

// ErrUnsupportedServer means the server, or a layer in front of it, does not
// run sqllock's statements as MySQL does, or cannot serve a kind of lease (a
// set through Vitess, a semaphore on TiDB), found before any such lease is
// taken (docs/servers.md). It matches errors.ErrUnsupported too.
var ErrUnsupportedServer error = unsupportedServer{}

type unsupportedServer struct{}

func (unsupportedServer) Error() string { return "sqllock: unsupported server" }

// Is makes ErrUnsupportedServer match errors.ErrUnsupported.
func (unsupportedServer) Is(target error) bool { return target == errors.ErrUnsupported }

// A HeldError is the error of [Client.TryAcquireSet] when a name of the set
// was held by another owner: nothing was taken. Names lists, sorted, those a
// read right after the refusal found held. It wraps [ErrNotAcquired].
type HeldError struct {
	Names []string
}

func (e *HeldError) Error() string {
	if len(e.Names) == 0 {
		return ErrNotAcquired.Error() + ": a name of the set was held by another owner (and released since)"
	}
	q := make([]string, len(e.Names))
	for i, n := range e.Names {
		q[i] = strconv.Quote(n)
	}
	return ErrNotAcquired.Error() + ": " + strings.Join(q, ", ") + " held by another owner"
}

// Unwrap returns [ErrNotAcquired].
func (e *HeldError) Unwrap() error { return ErrNotAcquired }

// passable reports whether err may pass: whether a loop that keeps trying
// (Elect, Acquire's polling, Once, a keep-alive) should go on after it.
func passable(err error) bool { return classify(err) != fault.Final }

// classify is fault.Classify, which reads the server's error number and the
// connection's errors, with this package's own errors: a closed Client is
// final; a server the first use's proof found read-only (internal/engine/facts.go),
// before it could refuse a write, is refused, as the server's own 1290.
func classify(err error) fault.Outcome {
	switch {
	case errors.Is(err, ErrClosed):
		return fault.Final
	case errors.Is(err, errReadOnlyServer):
		return fault.Refused
	}
	return fault.Classify(err)
}

// prefix starts the text of every error the package makes.
const prefix = "sqllock: "

// errorf returns fmt.Errorf(format, args...) with the text prefixed by
// "sqllock: " once: an argument that is an error of this package is printed
// without its own prefix, so wrapping [ErrNotHeld] in [ErrLockLost] reads
// "sqllock: lock lost: not held: ...", not "sqllock:" twice. errors.Is and
// errors.As see every %w argument, as with fmt.Errorf. format starts with
// what comes after the prefix.
func errorf(format string, args ...any) error {
	text := make([]any, len(args))
	for i, a := range args {
		if err, ok := a.(error); ok {
			a = strings.TrimPrefix(err.Error(), prefix)
		}
		text[i] = a
	}
	return &prefixedError{
		msg: prefix + fmt.Sprintf(strings.ReplaceAll(format, "%w", "%v"), text...),
		err: fmt.Errorf(format, args...),
	}
}

// joinErrors is errors.Join on one line: the errors that are not nil,
// their messages joined by "; ", each still found by errors.Is and
// errors.As. An error that another of errs already wraps is said once.
func joinErrors(errs ...error) error {
	var kept []error
	for _, err := range errs {
		if j, ok := err.(*joinedErrors); ok {
			kept = append(kept, j.errs...)
		} else if err != nil {
			kept = append(kept, err)
		}
	}
	for i := 0; i < len(kept); i++ {
		err := kept[i]
		if slices.ContainsFunc(kept[:i], func(e error) bool { return errors.Is(e, err) }) {
			kept = slices.Delete(kept, i, i+1)
			i--
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return &joinedErrors{kept}
}

type joinedErrors struct{ errs []error }

func (e *joinedErrors) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
		if i > 0 {
			msgs[i] = strings.TrimPrefix(msgs[i], prefix)
		}
	}
	return strings.Join(msgs, "; ")
}

func (e *joinedErrors) Unwrap() []error { return e.errs }

// prefixedError is an error made by errorf: its own text, and the
// fmt.Errorf error that wraps the arguments.
type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string { return e.msg }
func (e *prefixedError) Unwrap() error { return e.err }

// errReadOnlyServer means the server refuses writes, or would refuse them
// to an account without administrative privileges: a replica, or a primary
// during a failover. Classified as the server's own refusal (1290) is, so
// the calls that wait out a failover keep trying.
var errReadOnlyServer = errors.New("sqllock: the server is read-only")

// poolFull returns, for the error of a call that ended with its context,
// a note that every connection the pool may open was in use, as when the
// caller holds the last in a transaction: the call may have waited for one
// all along. "" otherwise.
func (c *Client) poolFull() string {
	s := c.db.Stats()
	if s.MaxOpenConnections <= 0 || s.InUse < s.MaxOpenConnections {
		return ""
	}
	return fmt.Sprintf(" (every connection of the pool was in use, at its limit SetMaxOpenConns(%d): the call may have waited for one the caller holds, in a transaction?)", s.MaxOpenConnections)
}

// ctxErr is fault.CtxErr: ctx's error, or DeadlineExceeded once its
// deadline has passed though its timer has not yet fired.
func ctxErr(ctx context.Context) error { return fault.CtxErr(ctx) }

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

var errAutocommitOff = errors.New("the session has autocommit off (a DSN's autocommit=0 or the server's default); sqllock's statements must commit on their own")

// serverError wraps an error from preparing or running a statement with the
// operation, once, and says how to mend a missing or foreign table.
func (c *Client) serverError(op string, err error) error {
	if errors.Is(err, ErrClosed) {
		return err
	}
	if c.eng.Closed() {
		// Close closed the statement under this call: database/sql says
		// "sql: statement is closed", which is ErrClosed, as exec says.
		return ErrClosed
	}
	if g := engine.SessionGuard(err); g != "" {
		if fault.ReadOnlyGuard(err) {
			return errorf("%s: %w (%s): %w", op, errReadOnlyServer, g, err)
		}
		return errorf("%s: %s: %w", op, g, err)
	}
	if p := c.eng.TableProblem(err); p != "" {
		return errorf("%s: %s: %w", op, p, err)
	}
	if fault.IsConnectError(err) {
		return errorf("%s: connect to the server: %w", op, err)
	}
	return errorf("%s: %w", op, err)
}
