package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrUnsupportedServer means the server, or something between it and the
// Client (a proxy, a sharding layer), does not run sqllock's statements as
// MySQL does, so a lease taken through it could be handed to two owners. It
// comes from a Client's first use, before any lease is taken, and names what
// was found.
var ErrUnsupportedServer = errors.New("sqllock: unsupported server")

// A server that calls itself MySQL may not behave like it: every decision
// sqllock makes rests on the insert id of the OK packet of the statement
// that made it (queries.sql), so a layer that hands back another number (one
// read afterwards with SELECT LAST_INSERT_ID(), perhaps on another pooled
// connection, or the first of two values a statement set) gives two owners
// one name. So before the first statement that writes, a Client proves, on
// one connection of its pool, what the statements rely on, with its own
// table, statements and DSN, under a proof name nobody else uses:
//
//  0. the version, as the connection answers a query on no table: a layer
//     answers that itself (Vitess says 8.4.6-Vitess), though it passes the
//     first-use check's query on the table to the server behind it;
//  1. acquire under token A: the insert id is a fence (above the marks 1 and
//     2 the statement sets first), and it is the fence the table holds;
//  2. refresh under token B, which matches no row and so sets no insert id:
//     0, not the value step 1 left in the session;
//  3. acquire under token B: 0, refused, while A's lease is live;
//  4. acquire under token A again: the same fence, as a retry after a lost
//     reply must give;
//  5. release under token A: the row was A's;
//
// then it deletes the proof name's rows. The proof costs eight statements
// (fifteen round trips with the default DSN, which prepares each write) and
// four commits, once per Client: about four and a half uncontended
// acquire-and-release pairs (BenchmarkFirstUse on MariaDB 10.11 here: a
// first use 4.9 ms, 1.7 ms without the proof, a warm pair 0.71 ms). A
// failed proof is made again by the next
// statement that writes. A server that refuses writes (read-only, a
// failover) fails the proof with its own error, which the callers that wait
// for a failover treat as they treat it from an acquire; reads (Inspect,
// List) need no proof.

// proofTTL is the proof lease's length: long enough that it cannot expire
// between its steps, short enough that one left behind by a proof cut off
// midway soon frees nothing anyone waits for (its name is the proof's own).
const proofTTL = time.Minute

// proofPrefix begins every proof name: a zero byte, which no name a person
// writes begins with, then the proof's own random token.
const proofPrefix = "\x00sqllock proof "

// vitessRefusal says why a Client refuses Vitess with the two-row forms.
const vitessRefusal = "vtgate puts its own session's last insert id in place of every LAST_INSERT_ID() without an argument, " +
	"so the two-row acquire, which reads there the mark its first row set, decides on another value, " +
	"and two clients could both be told they hold one name"

// refuseByVersion returns an error wrapping ErrUnsupportedServer for a
// server known by its version string to run the statements unsafely: Vitess,
// unless the first-use check chose the one-row forms, which read no
// LAST_INSERT_ID() (tablecheck.go) and which the proof then holds to their
// answers.
func (c *Client) refuseByVersion(version string) error {
	if strings.Contains(strings.ToLower(version), "vitess") && !c.oneRow.Load() {
		return errorf("%w: Vitess (%s): %s; no lease was taken", ErrUnsupportedServer, version, vitessRefusal)
	}
	return nil
}

// writes reports whether statement i writes, and so needs the proof first.
func writes(i int) bool {
	switch i {
	case qInspect, qList, qOnceDone, qLease:
		return false
	}
	return true
}

// proveOnce makes the proof unless it has passed already.
func (c *Client) proveOnce(ctx context.Context) error {
	c.mu.Lock()
	proven := c.proven
	c.mu.Unlock()
	if proven {
		return nil
	}
	if err := c.prove(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	c.proven = true
	c.mu.Unlock()
	return nil
}

// prove makes the proof above. A connection that breaks under it (a lost
// reply, a killed connection) is no answer: the proof is made again on
// another connection, under a fresh name, up to maxTransientAttempts times,
// as exec sends a statement again.
func (c *Client) prove(ctx context.Context) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = c.proveAttempt(ctx)
		if err == nil || !brokenProof(err) || attempt >= maxTransientAttempts {
			break
		}
		if werr := sleepCtx(ctx, transientBackoff(attempt)); werr != nil {
			err = fmt.Errorf("%w (last error: %w)", werr, err)
			break
		}
	}
	if err == nil || errors.Is(err, ErrUnsupportedServer) || isConnectError(err) {
		return err // serverError names the step
	}
	return fmt.Errorf("check the statements on a proof name: %w", err)
}

// brokenProof reports whether the proof failed because its connection broke.
func brokenProof(err error) bool {
	return classify(err) == failedUnknown || errors.Is(err, sql.ErrConnDone)
}

// proveAttempt makes one attempt at the proof on one connection, under a name
// of its own, and deletes what it left there, with a context of its own.
func (c *Client) proveAttempt(ctx context.Context) error {
	a, err := newToken()
	if err != nil {
		return fmt.Errorf("sqllock: token: %w", err)
	}
	b, err := newToken()
	if err != nil {
		return fmt.Errorf("sqllock: token: %w", err)
	}
	name := proofPrefix + a
	conn, err := c.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	c.mu.Lock()
	text := c.sql // TiDB's forms, if the first-use check chose them
	c.mu.Unlock()
	err = c.proveOn(ctx, conn, &text, name, a, b)
	if err != nil && !isRefusal(err) {
		// The proof name is ours alone: whatever the proof left there
		// goes, on any connection, whatever ctx has become.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = c.db.ExecContext(cctx, c.substitute(queries["proof_clear"]), name)
	}
	return err
}

// isRefusal reports whether err says the server refused the statement
// outright, having run nothing.
func isRefusal(err error) bool { return classify(err) == failedRefused }

// proveOn runs the proof's steps on conn: first the version as the
// connection itself answers it, on no table (the first-use check's
// VERSION() sits in a query on the table, which a sharding layer such as
// Vitess passes on to the server behind it), then the statements.
func (c *Client) proveOn(ctx context.Context, conn *sql.Conn, text *[numStmts]string, name, a, b string) error {
	var version string
	if err := retryRolledBack(ctx, func() error {
		return conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	}); err != nil {
		return err
	}
	if err := c.refuseByVersion(version); err != nil {
		return err
	}
	return c.proveStatements(ctx, conn, text, version, name, a, b)
}

// proveStatements runs steps 1 to 5 of the proof on conn, under name, with
// tokens a and b, on a server that calls itself version.
func (c *Client) proveStatements(ctx context.Context, conn *sql.Conn, text *[numStmts]string, version, name, a, b string) error {
	us := proofTTL.Microseconds()
	acquire := func(token string) (uint64, error) {
		args := []any{name, token, c.holder, us, name, token, c.holder, token, us}
		if c.oneRow.Load() {
			args = args[:tidbAcquireArgs]
		}
		id, err := proofExec(ctx, conn, text[qAcquire], args...)
		return uint64(id), err
	}
	unsupported := func(format string, args ...any) error {
		return errorf("%w: the server (%s), or a layer between it and this Client: %s, which MySQL and MariaDB never do, so a lease taken through it could have two owners; no lease was taken",
			ErrUnsupportedServer, version, fmt.Sprintf(format, args...))
	}

	fence, err := acquire(a)
	if err != nil {
		return err
	}
	var stored uint64
	if err := retryRolledBack(ctx, func() error {
		var holder sql.NullString
		var held sql.NullBool
		var left, ahead sql.NullInt64
		return conn.QueryRowContext(ctx, text[qInspect], name).Scan(&holder, &stored, &held, &left, &ahead)
	}); err != nil {
		return err
	}
	if fence <= 2 || fence != stored {
		return unsupported("an acquire that took a free name reported %d, and the table holds fence %d", fence, stored)
	}
	id, err := proofExec(ctx, conn, text[qRefresh], us, name, b)
	if err != nil {
		return err
	}
	if id != 0 {
		return unsupported("a refresh under a token that holds nothing reported %d, left by an earlier statement, instead of 0", id)
	}
	if id, err := acquire(b); err != nil {
		return err
	} else if id != 0 {
		return unsupported("an acquire of a name another owner held reported %d instead of 0 (refused)", id)
	}
	if again, err := acquire(a); err != nil {
		return err
	} else if again != fence {
		return unsupported("an acquire repeated by the name's owner reported %d instead of its fence %d", again, fence)
	}
	var n int64
	if err := retryRolledBack(ctx, func() error {
		res, err := conn.ExecContext(ctx, text[qRelease], name, a)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	}); err != nil {
		return err
	}
	if n != 1 {
		return unsupported("a release by the name's owner deleted %d rows instead of 1", n)
	}
	_, err = conn.ExecContext(ctx, c.substitute(queries["proof_clear"]), name)
	return err
}

// proofExec runs a statement of the proof and returns its insert id.
func proofExec(ctx context.Context, conn *sql.Conn, query string, args ...any) (int64, error) {
	var id int64
	err := retryRolledBack(ctx, func() error {
		res, err := conn.ExecContext(ctx, query, args...)
		if err == nil {
			id, err = res.LastInsertId()
		}
		return err
	})
	return id, err
}

// retryRolledBack runs f, a step of the proof, again while the server rolls
// it back (a deadlock, a cluster conflict), within retry's budget: the
// tokens make a repeat give the first attempt's answer. A broken connection
// ends the attempt, which prove makes again on another.
func retryRolledBack(ctx context.Context, f func() error) error {
	budget := time.Now().Add(maxRetryBudget)
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil || classify(err) != failedRolledBack {
			return err
		}
		wait := transientBackoff(attempt)
		if time.Now().Add(wait).After(budget) {
			return err
		}
		if werr := sleepCtx(ctx, wait); werr != nil {
			return fmt.Errorf("%w (last error: %w)", werr, err)
		}
	}
}
