package engine

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// The server's semantics the statements rely on, proven at first use on
// the proof's connection (proveEngine), with the Client's own acquire:
//
//   - the order an insert-or-update runs its rows: a takeover of an expired
//     lease reports the name taken (a fence) and writes the new owner. The
//     acquire carries a mark from its lease row to its fence row through
//     LAST_INSERT_ID(); an engine that evaluates every new row before it
//     updates the first reads no mark, and reports refused a takeover it
//     wrote.
//   - fractions of a second in time arithmetic: the lease's length as
//     stored is the ttl to the microsecond (ProofEngineTTL has a fraction),
//     and a microsecond added to the clock is one microsecond. An engine
//     that drops the fraction ends leases up to a second early.
//   - error 1690 on BIGINT UNSIGNED arithmetic past 2^64-1, which a set's
//     acquire relies on to refuse a held name and undo the statement.

// ProofEngineTTL is the takeover's lease in the proof: a minute and a
// fraction of a second that no rounding keeps.
const ProofEngineTTL = proofTTL + 123457*time.Microsecond

// proveEngine expires the lease owner holds on name, on conn, takes it over
// under token taker, and holds what the server answered and wrote to the
// semantics above.
func (s *Server) proveEngine(ctx context.Context, conn *sql.Conn, text *[NumStmts]string, version, name, owner, taker string) error {
	expired := -time.Second.Microseconds()
	// A rolled-back statement (a deadlock, a cluster conflict) is sent
	// again: the tokens make a repeat give the first's answer.
	// A release deletes owner's lease, if it holds one; the acquire then
	// takes the name, free, with a lease already expired. Neither an
	// acquire nor a refresh of owner's own lease would end it: they never
	// move an owner's expiry earlier (queries.sql).
	if err := fault.RetryRolledBack(ctx, func() error {
		if _, err := preparedExec(ctx, conn, text[Release], name, owner); err != nil {
			return err
		}
		_, err := s.proofAcquire(ctx, conn, text[Acquire], name, owner, expired)
		return err
	}); err != nil {
		return err
	}
	var id uint64
	if err := fault.RetryRolledBack(ctx, func() (err error) {
		id, err = s.proofAcquire(ctx, conn, text[Acquire], name, taker, ProofEngineTTL.Microseconds())
		return err
	}); err != nil {
		return err
	}
	var (
		got             []byte
		length, oneUsec sql.NullInt64
	)
	if err := fault.RetryRolledBack(ctx, func() error {
		return preparedQueryRow(ctx, conn, s.Text().Substitute(s.cfg.Queries["proof_engine"]), name).Scan(&got, &length, &oneUsec)
	}); err != nil {
		return err
	}
	var failed []string
	switch took := string(got) == taker; {
	case uint64(id) <= 2 && took:
		failed = append(failed, fmt.Sprintf("an acquire that took over an expired lease wrote its owner but reported %d, not a fence: "+
			"the server evaluated the statement's rows in another order than it writes them (all new rows before updating the first), "+
			"so the mark the first row sets was not seen by the second", uint64(id)))
	case !took:
		failed = append(failed, fmt.Sprintf("an acquire of a name whose lease had expired reported %d and did not write its owner", uint64(id)))
	}
	if length.Int64 != ProofEngineTTL.Microseconds() || oneUsec.Int64 != 1 {
		failed = append(failed, fmt.Sprintf("DATETIME(6) + INTERVAL n MICROSECOND lost the fraction of a second: a lease of %d µs was stored as %d µs, "+
			"and a microsecond added to UTC_TIMESTAMP(6) came to %d µs", ProofEngineTTL.Microseconds(), length.Int64, oneUsec.Int64))
	}
	err := fault.RetryRolledBack(ctx, func() error {
		_, err := preparedExec(ctx, conn, s.Text().Substitute(s.cfg.Queries["proof_overflow"]), name)
		return err // 1690, the answer, is no rollback: it comes back at once
	})
	if n, ok := fault.Errno(err); (!ok || n != fault.OutOfRange) && !strings.Contains(fmt.Sprint(err), "BIGINT UNSIGNED value is out of range") {
		// (A layer may renumber the server's error, and keep its text.)
		if err != nil {
			return err
		}
		failed = append(failed, "BIGINT UNSIGNED arithmetic past 2^64-1 gave no error 1690, "+
			"which a set's acquire relies on to refuse a held name")
	}
	if len(failed) > 0 {
		return s.refuseServer(version, "%s", strings.Join(failed, "; "))
	}
	return nil
}

// acquireArgs returns the acquire's arguments under token for us µs.
func (s *Server) acquireArgs(name, token string, us int64) []any {
	args := []any{name, token, s.cfg.Holder, us, name, token, s.cfg.Holder, token, us}
	if s.Forms().OneRow {
		args = args[:OneRowAcquireArgs]
	}
	return args
}

// A scanner is a row read by preparedQueryRow.
type scanner interface{ Scan(dest ...any) error }

// preparedQueryRow prepares query on conn and reads its one row with args,
// as preparedExec runs a statement.
func preparedQueryRow(ctx context.Context, conn *sql.Conn, query string, args ...any) scanner {
	st, err := conn.PrepareContext(ctx, query)
	if err != nil {
		return errRow{err}
	}
	return closingRow{st.QueryRowContext(ctx, args...), st}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type closingRow struct {
	row *sql.Row
	st  *sql.Stmt
}

func (r closingRow) Scan(dest ...any) error {
	defer r.st.Close()
	return r.row.Scan(dest...)
}
