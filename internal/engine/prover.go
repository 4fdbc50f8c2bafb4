package engine

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/sqllock/sqllock/internal/fault"
)

// The statements of the proof (proof.go): every statement a Client sends
// for a lease on one name, each with an answer that takes and one that
// refuses, run as the Client runs it. Statements the Client prepares
// (Server.Stmt: acquire, refresh, release, release_at_least, inspect) are
// prepared on the proof's connection and executed there, so the proof sends
// the bytes the Client will send whatever the DSN says (with
// interpolateParams=true an execution with arguments on a connection goes
// as text, which MySQL Router refuses where a prepared statement passes);
// Lock.Check's goes through a transaction with its arguments, as Check
// sends it. The statements of sets, semaphores and Once are proven at their
// first use (later.go).

// A prover runs proof statements on one connection and keeps the
// statements it prepared there until close.
type prover struct {
	s       *Server
	ctx     context.Context
	conn    *sql.Conn
	version string
	stmts   map[string]*sql.Stmt
}

func (s *Server) newProver(ctx context.Context, conn *sql.Conn, version string) *prover {
	return &prover{s: s, ctx: ctx, conn: conn, version: version, stmts: map[string]*sql.Stmt{}}
}

// close closes the statements the prover prepared.
func (p *prover) close() {
	for _, st := range p.stmts {
		_ = st.Close()
	}
}

// stmt returns text prepared on the proof's connection, named stmt in errors.
func (p *prover) stmt(stmt, text string) (*sql.Stmt, error) {
	if st := p.stmts[text]; st != nil {
		return st, nil
	}
	var st *sql.Stmt
	err := fault.RetryRolledBack(p.ctx, func() (err error) {
		st, err = p.conn.PrepareContext(p.ctx, text)
		return err
	})
	if err != nil {
		return nil, p.failed(stmt, "prepare", err)
	}
	p.stmts[text] = st
	return st, nil
}

// exec runs statement stmt, of text, prepared, with args, as step (what the
// step proves, for errors).
func (p *prover) exec(stmt, step, text string, args ...any) (sql.Result, error) {
	st, err := p.stmt(stmt, text)
	if err != nil {
		return nil, err
	}
	var res sql.Result
	err = fault.RetryRolledBack(p.ctx, func() (err error) {
		res, err = st.ExecContext(p.ctx, args...)
		return err
	})
	if err != nil {
		return nil, p.failed(stmt, step, err)
	}
	return res, nil
}

// execText runs statement stmt, text with no arguments, as the Client sends
// a set's statements: as text (Send with Text).
func (p *prover) execText(stmt, step, text string) (sql.Result, error) {
	var res sql.Result
	err := fault.RetryRolledBack(p.ctx, func() (err error) {
		res, err = p.conn.ExecContext(p.ctx, text)
		return err
	})
	if err != nil {
		return nil, p.failed(stmt, step, err)
	}
	return res, nil
}

// id runs a statement as exec does and returns its insert id.
func (p *prover) id(stmt, step, text string, args ...any) (uint64, error) {
	res, err := p.exec(stmt, step, text, args...)
	if err != nil {
		return 0, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, p.failed(stmt, step, err)
	}
	return uint64(id), nil
}

// rows returns the affected rows of res, from statement stmt.
func (p *prover) rows(stmt, step string, res sql.Result) (int64, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return 0, p.failed(stmt, step, err)
	}
	return n, nil
}

// inTx runs f in a transaction on the proof's connection, as Lock.Check
// runs in the caller's, and rolls it back: what it wrote is the proof's.
func (p *prover) inTx(stmt string, f func(tx *sql.Tx) error) error {
	return fault.RetryRolledBack(p.ctx, func() error {
		tx, err := p.conn.BeginTx(p.ctx, nil)
		if err != nil {
			return p.failed(stmt, "begin a transaction for it", err)
		}
		defer func() { _ = tx.Rollback() }()
		return f(tx)
	})
}

// failed says which statement of the proof failed, at which step, with the
// server's error. An error a session setting can explain (a syntax error,
// an out-of-range value) also names the session's sql_mode; MySQL Router's
// refusal of LAST_INSERT_ID names the router and the DSN.
func (p *prover) failed(stmt, step string, err error) error {
	if errors.Is(err, sql.ErrConnDone) {
		// The connection broke under an earlier step (database/sql closed
		// it then): no answer, as a broken connection is none.
		err = fmt.Errorf("%w (%w)", err, driver.ErrBadConn)
	}
	if n, ok := fault.Errno(err); ok && SessionGuard(err) == "" { // the guard's 1690 says what it found (session.go)
		switch n {
		case erNativeFunctionRefused:
			return p.s.cfg.Errorf("%w: MySQL Router with connection sharing refused statement %s (%s) (3566, LAST_INSERT_ID on a connection it may share); "+
				"drop interpolateParams=true from the DSN, or turn connection sharing off: %w", p.s.cfg.Errors.Unsupported, stmt, step, err)
		case erUnknownVariable, fault.UnknownError:
			// A server that calls itself MySQL without MySQL's variables
			// (go-mysql-server: 1105), refusing one the session guard
			// reads (queries.sql).
			if n == erUnknownVariable || strings.Contains(err.Error(), "Unknown system variable") {
				return p.s.cfg.Errorf("%w: the server (%s), or a layer between it and this Client, does not know a system variable statement %s reads (%s), which MySQL does: %w",
					p.s.cfg.Errors.Unsupported, p.version, stmt, step, err)
			}
		case erNotSupportedYet:
			// A layer that cannot run the statement as it is written
			// (Vitess's sharded keyspace: a correlated subquery inside an
			// expression, VT12001).
			return p.s.cfg.Errorf("%w: the server (%s), or a layer between it and this Client, refused statement %s (%s) as not supported: %w",
				p.s.cfg.Errors.Unsupported, p.version, stmt, step, err)
		case erParse, fault.OutOfRange, erTruncated, erBadValue:
			var mode sql.NullString
			if qerr := p.conn.QueryRowContext(p.ctx, "SELECT @@SESSION.sql_mode").Scan(&mode); qerr == nil {
				return p.s.cfg.Errorf("%w: statement %s failed under this session's sql_mode %q (%s): %w", p.s.cfg.Errors.Unsupported, stmt, mode.String, step, err)
			}
		}
	}
	return fmt.Errorf("statement %s (%s): %w", stmt, step, err)
}

// unsupported is the error of a proof whose statement answered as MySQL and
// MariaDB never do.
func (p *prover) unsupported(stmt, format string, args ...any) error {
	return p.s.cfg.Errorf("%w: the server (%s), or a layer between it and this Client: statement %s: %s, which MySQL and MariaDB never do, so a lease taken through it could have two owners; no lease was taken",
		p.s.cfg.Errors.Unsupported, p.version, stmt, fmt.Sprintf(format, args...))
}

// Server errors a session's sql_mode may cause in a statement.
const (
	erParse     = 1064 // a syntax error: a mode that parses SQL otherwise (ORACLE, ANSI_QUOTES, ...)
	erTruncated = 1292 // a truncated value under a strict mode
	erBadValue  = 1366 // an incorrect value under a strict mode

	erUnknownVariable = 1193 // a system variable the server does not have
	erNotSupportedYet = 1235 // a statement the server does not support
)

// proveStatements runs the single-name steps of the proof (proof.go) on
// conn, under name, with tokens a and b, on a server that calls itself
// version, each statement in the form the Client chose (text).
func (s *Server) proveStatements(ctx context.Context, conn *sql.Conn, text *[NumStmts]string, version, name, a, b string) error {
	p := s.newProver(ctx, conn, version)
	defer p.close()
	us := proofTTL.Microseconds()
	acquire := func(step, token string) (uint64, error) {
		return p.id("acquire", step, text[Acquire], s.acquireArgs(name, token, us)...)
	}

	fence, err := acquire("take a free name", a)
	if err != nil {
		return err
	}
	st, err := p.stmt("inspect", text[Inspect])
	if err != nil {
		return err
	}
	var stored uint64
	err = fault.RetryRolledBack(ctx, func() error {
		var holder sql.NullString
		var held, minHold sql.NullBool
		var left, ahead sql.NullInt64
		return st.QueryRowContext(ctx, name).Scan(&holder, &stored, &held, &left, &ahead, &minHold)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return p.unsupported("inspect", "it found no fence for a name an acquire had just taken (reported fence %d)", fence)
	}
	if err != nil {
		return p.failed("inspect", "read the fence an acquire wrote", err)
	}
	if fence <= 2 || fence != stored {
		return p.unsupported("acquire", "an acquire that took a free name reported %d, and the table holds fence %d", fence, stored)
	}
	if id, err := p.id("refresh", "refresh under another token", text[Refresh], us, name, b); err != nil {
		return err
	} else if id != 0 {
		return p.unsupported("refresh", "a refresh under a token that holds nothing reported %d, left by an earlier statement, instead of 0", id)
	}
	if id, err := acquire("take a name another owner holds", b); err != nil {
		return err
	} else if id != 0 {
		return p.unsupported("acquire", "an acquire of a name another owner held reported %d instead of 0 (refused)", id)
	}
	if again, err := acquire("take again a name the owner holds", a); err != nil {
		return err
	} else if again != fence {
		return p.unsupported("acquire", "an acquire repeated by the name's owner reported %d instead of its fence %d", again, fence)
	}
	if id, err := p.id("refresh", "refresh by the owner", text[Refresh], us, name, a); err != nil {
		return err
	} else if id == 0 {
		return p.unsupported("refresh", "a refresh by the owner of a live lease reported 0 (not extended)")
	}
	if err := p.proveCheck(text[Check], name, a, b); err != nil {
		return err
	}
	if id, err := p.id("release_at_least", "keep under another token", text[ReleaseAtLeast], us, name, b); err != nil {
		return err
	} else if id != 0 {
		return p.unsupported("release_at_least", "a release with a minimum hold under a token that holds nothing reported %d instead of 0", id)
	}
	if id, err := p.id("release_at_least", "keep by the owner", text[ReleaseAtLeast], us, name, a); err != nil {
		return err
	} else if id == 0 {
		return p.unsupported("release_at_least", "a release with a minimum hold by the lease's owner reported 0 (not ours)")
	}
	for _, step := range []struct {
		token string
		want  int64
		what  string
	}{{b, 0, "under another token"}, {s.cfg.Released(a), 1, "by the owner"}} {
		// release_at_least left the lease under the token's released form.
		res, err := p.exec("release", "release "+step.what, text[Release], name, step.token)
		if err != nil {
			return err
		}
		if n, err := p.rows("release", "release "+step.what, res); err != nil {
			return err
		} else if n != step.want {
			return p.unsupported("release", "a release %s changed %d rows instead of %d", step.what, n, step.want)
		}
	}
	_, err = conn.ExecContext(ctx, s.Text().Substitute(s.cfg.Queries["proof_clear"]), name)
	if err != nil {
		return p.failed("proof_clear", "delete the proof name's rows", err)
	}
	return nil
}

// proveCheck proves Lock.Check's statement, text, on a lease that token a
// holds live on name: inside a transaction, as Check sends it, it must
// change the lease row for a and no row for b.
func (p *prover) proveCheck(text, name, a, b string) error {
	return p.inTx("check", func(tx *sql.Tx) error {
		for _, step := range []struct {
			token string
			want  int64
			what  string
		}{{b, 0, "under another token"}, {a, 1, "by the owner"}} {
			res, err := tx.ExecContext(p.ctx, text, name, step.token)
			if err != nil {
				return p.failed("check", "check "+step.what, err)
			}
			if n, err := p.rows("check", "check "+step.what, res); err != nil {
				return err
			} else if n != step.want {
				return p.unsupported("check", "a check %s of a live lease changed %d rows instead of %d", step.what, n, step.want)
			}
		}
		return nil
	})
}
