package sqllock

import (
	_ "embed"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/sqltext"
)

//go:embed queries.sql
var queriesSQL string

//go:embed schema.sql
var schemaSQL string

// The statements' text is built in internal/sqltext; this file embeds the
// files it is built from and hands the package what the Client knows.

// tablePlaceholder is how queries.sql and schema.sql name the table; a
// Client puts its own quoted table name in its place once, in New.
const tablePlaceholder = sqltext.Placeholder

// queries holds the statements of queries.sql by name.
var queries = sqltext.MustSplit(queriesSQL)

// schema is the CREATE TABLE statement of schema.sql.
var schema = sqltext.MustSplit("-- name: schema\n" + schemaSQL)["schema"]

// splitQueries splits text into its statements by name (sqltext.Split).
func splitQueries(text string) (map[string]string, error) { return sqltext.Split(text) }

// quoteTable checks name and returns it backtick-quoted (sqltext.QuoteTable).
func quoteTable(name string) (string, error) { return sqltext.QuoteTable(name) }

// Statements of queries.sql, by index (internal/engine).
const (
	qAcquire        = engine.Acquire
	qRefresh        = engine.Refresh
	qRelease        = engine.Release
	qInspect        = engine.Inspect
	qReleaseAtLeast = engine.ReleaseAtLeast // do.go
	qCheck          = engine.Check          // lock.go
	qList           = engine.List           // admin.go
	qOnceDone       = engine.OnceDone       // once.go
	qOnceRecord     = engine.OnceRecord     // once.go
	qLease          = engine.Lease          // admin.go
	qOnceReset      = engine.OnceReset      // admin.go
	qLockDelay      = engine.LockDelay      // admin.go
	numStmts        = engine.NumStmts
)

var stmtNames = engine.Names

// firstUseSQL returns the first_use query about table as a Client sends it
// at its first use, before it knows the database.
func firstUseSQL(table string) string { return queries.TableNamed("first_use", table) }

// bind puts literals in place of the placeholders of stmt, in order
// (sqltext.Bind).
func bind(stmt string, lits ...string) string { return sqltext.Bind(stmt, lits...) }

// hexLiteral writes name as a hex literal, X'...'.
func hexLiteral(name string) string { return sqltext.Hex(name) }

// Every statement a Client sends goes through its engine (internal/engine),
// which makes the first-use check and the proofs, prepares each statement
// once, and sends it again while the server rolls it back or the connection
// breaks before the reply; serverError (errors.go) says what a failure means.

// newEngine returns the engine that checks the server and table, proves
// the statements, and prepares and sends them.
func (c *Client) newEngine() *engine.Server {
	return engine.New(engine.Config{
		DB:        c.db,
		Queries:   queries,
		Table:     c.table,
		Holder:    c.holder,
		NameLen:   MaxNameLen,
		HolderLen: maxHolderLen,
		Classify:  classify,
		Retried:   c.logRetry,
		Chosen:    c.chosen,
		Log:       c.log,
		Frozen:    c.frozenSeen,
		Errorf:    errorf,
		Errors: engine.Errors{
			Unsupported:   ErrUnsupportedServer,
			BadTable:      ErrBadTable,
			ReadOnly:      errReadOnlyServer,
			AutocommitOff: errAutocommitOff,
		},
		Token:          newToken,
		Released:       releasedToken,
		Closed:         ErrClosed,
		Budget:         c.budget,
		CleanupTimeout: cleanupTimeout,
	})
}

// chosen is told the forms the first-use check chose for the server that
// answered version: where the wake-up channels do not serve
// (engine.Forms.Channels: TiDB, Vitess; wake_test.go) they stay off and
// waiters poll.
func (c *Client) chosen(f *engine.Forms, version string) {
	if !f.Channels() {
		c.wait.Refuse()
	}
}
