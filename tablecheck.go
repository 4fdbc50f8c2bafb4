package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// A schemaColumn is a column of schema.sql as information_schema shows it.
type schemaColumn struct {
	name string
	def  string         // its definition in schema.sql
	typ  *regexp.Regexp // the COLUMN_TYPE values that serve; none has a collation
	min  int            // for a VARBINARY, the least width that serves
}

// schemaColumns are the columns of schema.sql (TestSchema_columns checks
// them against the file). A wider VARBINARY serves as well; anything else
// must be as written. The types are binary, so no collation folds names or
// tokens together; DATETIME(6) keeps microseconds and does not move with
// the session time_zone.
var schemaColumns = []schemaColumn{
	{name: "name", def: "VARBINARY(255) NOT NULL", typ: varbinaryType, min: MaxNameLen},
	{name: "kind", def: "BINARY(1) NOT NULL", typ: regexp.MustCompile(`^binary\(1\)$`)},
	{name: "owner", def: "VARBINARY(32) NOT NULL", typ: varbinaryType, min: 32},
	{name: "holder", def: "VARBINARY(255) NOT NULL", typ: varbinaryType, min: maxHolderLen},
	// MariaDB and MySQL 5.7 show a display width, MySQL 8.0 none.
	{name: "fence", def: "BIGINT UNSIGNED NOT NULL", typ: regexp.MustCompile(`^bigint(\(\d+\))? unsigned$`)},
	{name: "acquired_at", def: "DATETIME(6) NOT NULL", typ: regexp.MustCompile(`^datetime\(6\)$`)},
	{name: "expires_at", def: "DATETIME(6) NOT NULL", typ: regexp.MustCompile(`^datetime\(6\)$`)},
}

var varbinaryType = regexp.MustCompile(`^varbinary\((\d+)\)$`)

// schemaKey is schema.sql's primary key, the table's only unique key.
var schemaKey = []string{"name", "kind"}

// firstUse is what the first_use query found.
type firstUse struct {
	autocommit bool
	version    string
	database   sql.NullString // DATABASE(), or after the first use its literal
	// carries: LAST_INSERT_ID() saw the value set earlier in the same
	// statement, which the two-row acquire needs (queries.sql, carries)
	carries bool
	found   bool   // the table exists
	engine  string // of the table
	columns map[string]foundColumn
	indexes map[string]*foundIndex
}

// errNoDatabase is the first use's refusal of a connection with no
// database: the Client's statements name the table in the database the
// first use found, whatever USE a connection of the pool runs later.
var errNoDatabase = errors.New("the connection has no database selected: name the table's database in the DSN (user@tcp(host:3306)/dbname)")

// erNativeFunctionRefused is MySQL Router's refusal of LAST_INSERT_ID on a
// connection that connection sharing may move (queries.sql, carries).
const erNativeFunctionRefused = 3566

// readCarries sends the carries query. A layer that refuses it (MySQL
// Router, 3566) does not rewrite it either: the two-row forms stay, and
// the proof holds them to their answers.
func (c *Client) readCarries(ctx context.Context) (bool, error) {
	var set, read sql.NullString
	err := c.db.QueryRowContext(ctx, queries["carries"], 1).Scan(&set, &read)
	if n, ok := fault.Errno(err); ok && n == erNativeFunctionRefused {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return set.Valid && set.String == read.String, nil
}

type foundColumn struct {
	typ, collation string
	nullable       bool
}

type foundIndex struct {
	unique  bool
	columns []string // in key order; a prefix part is written col(n)
}

// checkFirstUse runs the first_use query and holds what it finds against
// schema.sql. It returns found false, and no error, when the table does not
// exist: the statements then fail with the server's own error, which says
// how to create it, and the check runs again on the next call.
func (c *Client) checkFirstUse(ctx context.Context) (found bool, err error) {
	table := strings.Trim(c.table, "`")
	var fu *firstUse
	err = fault.Transient(ctx, func() error {
		var err error
		fu, err = c.readFirstUse(ctx, table)
		if err == nil && fu.autocommit && !c.eng.Forms().Chosen {
			fu.carries, err = c.readCarries(ctx)
		}
		return err
	})
	if err != nil {
		if fault.IsConnectError(err) {
			return false, err // serverError names the step
		}
		return false, fmt.Errorf("check the server and table: %w", err)
	}
	if !fu.autocommit {
		return false, errAutocommitOff
	}
	database := fu.database
	if !c.eng.Forms().Chosen && !fu.carries && !strings.Contains(fu.version, "MariaDB") && !strings.Contains(fu.version, "TiDB") {
		// Vitess, as serverForms tells it: vtgate sends a query that reads
		// a table to a tablet, whose DATABASE() (and VERSION()) are its
		// own (vt_<keyspace>_<shard>); a query of no table it answers
		// itself, with the keyspace, the name a statement gives vtgate.
		if err := c.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
			return false, fmt.Errorf("check the server and table: %w", err)
		}
	}
	if !database.Valid {
		return false, errNoDatabase
	}
	qualified, db, err := sqltext.Qualify(c.table, database.String)
	if err != nil {
		return false, err
	}
	c.chooseForms(fu.version, qualified, db, fu.carries)
	if err := c.refuseByVersion(fu.version); err != nil {
		return false, err
	}
	if !fu.found {
		return false, nil
	}
	if err := fu.compare(c.table); err != nil {
		return false, err
	}
	c.recheck.due.Store(time.Now().Add(tableRecheckEvery).UnixNano())
	return true, nil
}

// tableRecheckEvery is how often a running Client checks its table again
// (tableRecheck).
const tableRecheckEvery = time.Second

// A tableRecheck checks the Client's table against schema.sql again, as the
// first use did, while the Client runs: an operator may alter it under
// running Clients. A column made DATETIME without fractions, say, cuts up
// to a second off every lease written, which no answer shows (the insert
// ids come from the BIGINT fence and marks), and gave several holders at
// once with 1s leases. So the trigger is time: the first statement that
// takes or extends a lease after tableRecheckEvery sends the first_use
// query first (one read of the table's definition, about as dear as one
// lock statement, at most once a second; twice while the Client waits for
// a name: see tableCheckAhead), and while the table differs,
// every such statement fails with the difference, wrapping ErrBadTable,
// and sends nothing; it is checked again each second, so a mended table
// serves again. Changes an answer does show (the fence row gone, a mark or
// slot out of range) are reported where the answer is read. The zero value
// is due at once; checkFirstUse sets the first due time.
type tableRecheck struct {
	due     atomic.Int64 // UnixNano from which the next check is due
	running atomic.Bool  // a check is under way; other calls do not wait for it
	bad     atomic.Pointer[error]
}

// tableStillGood returns the difference the last check found between the
// table and schema.sql, checking again first when due. A check that cannot
// read the table's definition (a lost connection, the table gone) finds no
// difference: the statement then meets the same trouble and says so.
func (c *Client) tableStillGood(ctx context.Context) error {
	return c.tableCheckAhead(ctx, 0)
}

// tableCheckAhead is tableStillGood for a caller about to wait before its
// statement: it checks already when the check comes due within ahead, so
// that the statement, sent when the wait ends, finds it fresh instead of
// sending it first, which would delay the statement by a round trip.
func (c *Client) tableCheckAhead(ctx context.Context, ahead time.Duration) error {
	r := &c.recheck
	if now := time.Now().UnixNano(); now+int64(ahead) >= r.due.Load() && r.running.CompareAndSwap(false, true) {
		r.due.Store(now + int64(tableRecheckEvery))
		defer r.running.Store(false)
		fu, err := c.readFirstUse(ctx, strings.Trim(c.table, "`"))
		if err == nil && fu.found {
			if err := fu.compare(c.table); err != nil {
				err = errorf("%w (found while this Client ran: the table was altered; until it is mended, no lease is taken or extended)", err)
				r.bad.Store(&err)
				return err
			}
			r.bad.Store(nil)
		}
	}
	if p := r.bad.Load(); p != nil {
		return *p
	}
	return nil
}

// readFirstUse sends the first_use query and collects its rows about table.
func (c *Client) readFirstUse(ctx context.Context, table string) (*firstUse, error) {
	rows, err := c.db.QueryContext(ctx, c.eng.Text().Named("first_use"))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	fu := &firstUse{columns: map[string]foundColumn{}, indexes: map[string]*foundIndex{}}
	type keyPart struct {
		seq    int
		column string
	}
	parts := map[string][]keyPart{}
	foldNames := false
	for rows.Next() {
		var what string
		var f [6]sql.NullString
		if err := rows.Scan(&what, &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]); err != nil {
			return nil, err
		}
		if what == "server" {
			fu.autocommit = f[0].String == "1"
			fu.version = f[1].String
			foldNames = f[2].String != "0"
			fu.database = f[3]
			continue
		}
		if col := nullAnswer(what, f); col != "" {
			return nil, errorf("%w: cannot check the table: information_schema answered NULL for %s, which it never leaves NULL "+
				"(the first_use query, queries.sql): the server's answers cannot be trusted, so nothing is known of the table", ErrUnsupportedServer, col)
		}
		// The views may match table names without regard to case; a
		// server that stores them as written tells them apart.
		if f[0].String != table && !(foldNames && strings.EqualFold(f[0].String, table)) {
			continue
		}
		switch what {
		case "table":
			fu.found, fu.engine = true, f[1].String
		case "column":
			fu.columns[strings.ToLower(f[1].String)] = foundColumn{
				typ:       strings.ToLower(f[2].String),
				nullable:  f[3].String != "NO",
				collation: f[4].String,
			}
		case "index":
			ix := fu.indexes[f[1].String]
			if ix == nil {
				ix = &foundIndex{}
				fu.indexes[f[1].String] = ix
			}
			ix.unique = f[2].String == "0"
			seq, _ := strconv.Atoi(f[3].String)
			col := strings.ToLower(f[4].String)
			if f[5].Valid {
				col += "(" + f[5].String + ")"
			}
			parts[f[1].String] = append(parts[f[1].String], keyPart{seq, col})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for name, ps := range parts {
		slices.SortFunc(ps, func(a, b keyPart) int { return a.seq - b.seq })
		for _, p := range ps {
			fu.indexes[name].columns = append(fu.indexes[name].columns, p.column)
		}
	}
	return fu, nil
}

// nullAnswer returns the column of information_schema that a first_use row
// of kind what answered NULL where the view never does (a NOT NULL column
// of it), or "". STATISTICS.COLUMN_NAME may be NULL (a functional key part)
// and COLLATION_NAME is NULL for binary columns.
func nullAnswer(what string, f [6]sql.NullString) string {
	var need map[int]string
	switch what {
	case "server":
		need = map[int]string{0: "@@autocommit", 1: "VERSION()", 2: "@@lower_case_table_names"}
	case "table":
		need = map[int]string{0: "TABLES.TABLE_NAME", 1: "TABLES.ENGINE"}
	case "column":
		need = map[int]string{0: "COLUMNS.TABLE_NAME", 1: "COLUMNS.COLUMN_NAME", 2: "COLUMNS.COLUMN_TYPE", 3: "COLUMNS.IS_NULLABLE"}
	case "index":
		need = map[int]string{0: "STATISTICS.TABLE_NAME", 1: "STATISTICS.INDEX_NAME", 2: "STATISTICS.NON_UNIQUE", 3: "STATISTICS.SEQ_IN_INDEX"}
	}
	for i := range f {
		if col, ok := need[i]; ok && !f[i].Valid {
			return col
		}
	}
	return ""
}

// compare holds the table fu found against schema.sql and returns an error
// wrapping ErrBadTable that names every difference and the ALTER TABLE
// statement that mends them all, or nil.
func (fu *firstUse) compare(table string) error {
	var problems, fixes []string
	if !strings.EqualFold(fu.engine, "InnoDB") {
		problems = append(problems, fmt.Sprintf("the engine is %s, must be InnoDB (row locks and transactions)", fu.engine))
		fixes = append(fixes, "ENGINE=InnoDB")
	}
	for _, want := range schemaColumns {
		got, ok := fu.columns[want.name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("column %s is missing, must be %s", want.name, want.def))
			fixes = append(fixes, fmt.Sprintf("ADD COLUMN %s %s", want.name, want.def))
		case !want.serves(got):
			problems = append(problems, fmt.Sprintf("column %s is %s, must be %s", want.name, got.describe(), want.def))
			fixes = append(fixes, fmt.Sprintf("MODIFY COLUMN %s %s", want.name, want.def))
		}
	}
	want := strings.Join(schemaKey, ", ")
	if pk, ok := fu.indexes["PRIMARY"]; !ok || !slices.Equal(pk.columns, schemaKey) {
		if ok {
			problems = append(problems, fmt.Sprintf("the primary key is (%s), must be (%s)", strings.Join(pk.columns, ", "), want))
			fixes = append(fixes, "DROP PRIMARY KEY")
		} else {
			problems = append(problems, fmt.Sprintf("there is no primary key, must be (%s)", want))
		}
		fixes = append(fixes, fmt.Sprintf("ADD PRIMARY KEY (%s)", want))
	}
	for _, name := range slices.Sorted(maps.Keys(fu.indexes)) {
		if ix := fu.indexes[name]; name != "PRIMARY" && ix.unique {
			// The upsert would also meet rows through this key, and it
			// makes the upsert unsafe for statement-based replication.
			problems = append(problems, fmt.Sprintf("unique key %s (%s) must not be there: the primary key must be the only unique key", name, strings.Join(ix.columns, ", ")))
			fixes = append(fixes, fmt.Sprintf("DROP INDEX `%s`", strings.ReplaceAll(name, "`", "``")))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return errorf("%w: in %s, %s; mend it with: ALTER TABLE %s %s",
		ErrBadTable, table, strings.Join(problems, "; "), table, strings.Join(fixes, ", "))
}

// serves reports whether a column found in the table works as this one.
func (want schemaColumn) serves(got foundColumn) bool {
	if got.nullable || got.collation != "" {
		return false
	}
	m := want.typ.FindStringSubmatch(got.typ)
	if m == nil {
		return false
	}
	if want.min > 0 {
		n, err := strconv.Atoi(m[1])
		return err == nil && n >= want.min
	}
	return true
}

// describe says what a column is, in schema.sql's terms.
func (got foundColumn) describe() string {
	s := strings.ToUpper(got.typ)
	if got.collation != "" {
		s += " COLLATE " + got.collation
	}
	if got.nullable {
		return s + " NULL"
	}
	return s + " NOT NULL"
}

// chooseForms puts the server's forms of the statements in place, before
// any is prepared, once (engine.Server.Choose): a second call (another call's check got here
// first) changes nothing. On TiDB and Vitess the wake-up channels stay
// off: TiDB's GET_LOCK, built on its own transactions, neither granted
// waiters in the order they came nor freed a killed connection's lock at
// once in the tests (wake_test.go); vtgate runs every locking function of
// a session on a connection it reserves on one shard, and the tests that
// would show the channels right read the processlist and KILL connections,
// which vtgate does not pass on. Waiters poll there.
func (c *Client) chooseForms(version, qualified, db string, carries bool) {
	f := c.eng.Choose(version, qualified, db, carries)
	if f.OneRow {
		c.wait.Refuse()
	}
	if f.OneRow || !f.LockWait && !f.MySQL {
		// Said once, as the watch's own refusal is (frozen.go).
		c.frozen.warned.Do(func() {
			c.frozen.off.Store(true)
			c.log.Info("sqllock: a holder frozen inside Lock.Check is not ended on this server (TiDB, Vitess, MySQL 5.7): "+
				"its lease row stays locked until the server ends its transaction (TiDB's tidb_idle_transaction_timeout, "+
				"vttablet's transaction timeout, wait_timeout); see docs/guarantees.md", "version", version)
		})
	}
}
