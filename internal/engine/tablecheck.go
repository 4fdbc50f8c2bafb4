package engine

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

// A SchemaColumn is a column of schema.sql as information_schema shows it.
type SchemaColumn struct {
	Name string
	Def  string         // its definition in schema.sql
	typ  *regexp.Regexp // the COLUMN_TYPE values that serve; none has a collation
	min  int            // for a VARBINARY, the least width that serves
}

// SchemaColumns returns the columns of schema.sql, for a name column of
// nameLen bytes and a holder column of holderLen (TestSchema_columns checks
// them against the file). A wider VARBINARY serves as well; anything else
// must be as written. The types are binary, so no collation folds names or
// tokens together; DATETIME(6) keeps microseconds and does not move with
// the session time_zone.
func SchemaColumns(nameLen, holderLen int) []SchemaColumn {
	return []SchemaColumn{
		{Name: "name", Def: "VARBINARY(255) NOT NULL", typ: varbinaryType, min: nameLen},
		{Name: "kind", Def: "BINARY(1) NOT NULL", typ: binary1Type},
		{Name: "owner", Def: "VARBINARY(32) NOT NULL", typ: varbinaryType, min: 32},
		{Name: "holder", Def: "VARBINARY(255) NOT NULL", typ: varbinaryType, min: holderLen},
		// MariaDB and MySQL 5.7 show a display width, MySQL 8.0 none.
		{Name: "fence", Def: "BIGINT UNSIGNED NOT NULL", typ: bigintType},
		{Name: "acquired_at", Def: "DATETIME(6) NOT NULL", typ: datetime6Type},
		{Name: "expires_at", Def: "DATETIME(6) NOT NULL", typ: datetime6Type},
	}
}

var (
	varbinaryType = regexp.MustCompile(`^varbinary\((\d+)\)$`)
	binary1Type   = regexp.MustCompile(`^binary\(1\)$`)
	bigintType    = regexp.MustCompile(`^bigint(\(\d+\))? unsigned$`)
	datetime6Type = regexp.MustCompile(`^datetime\(6\)$`)
)

// SchemaKey is schema.sql's primary key, the table's only unique key.
var SchemaKey = []string{"name", "kind"}

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
func (s *Server) readCarries(ctx context.Context) (bool, error) {
	var set, read sql.NullString
	err := s.cfg.DB.QueryRowContext(ctx, s.cfg.Queries["carries"], 1).Scan(&set, &read)
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
func (s *Server) checkFirstUse(ctx context.Context) (found bool, err error) {
	table := strings.Trim(s.cfg.Table, "`")
	var fu *firstUse
	err = fault.Transient(ctx, func() error {
		var err error
		fu, err = s.readFirstUse(ctx, table)
		if err == nil && fu.autocommit && !s.Forms().Chosen {
			fu.carries, err = s.readCarries(ctx)
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
		return false, s.cfg.Errors.AutocommitOff
	}
	database := fu.database
	if !s.Forms().Chosen && !fu.carries && !strings.Contains(fu.version, "MariaDB") && !strings.Contains(fu.version, "TiDB") {
		// Vitess, as serverForms tells it: vtgate sends a query that reads
		// a table to a tablet, whose DATABASE() (and VERSION()) are its
		// own (vt_<keyspace>_<shard>); a query of no table it answers
		// itself, with the keyspace, the name a statement gives vtgate.
		if err := s.cfg.DB.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
			return false, fmt.Errorf("check the server and table: %w", err)
		}
	}
	if !database.Valid {
		return false, errNoDatabase
	}
	qualified, db, err := sqltext.Qualify(s.cfg.Table, database.String)
	if err != nil {
		return false, err
	}
	s.chooseForms(fu.version, qualified, db, fu.carries)
	if err := s.refuseByVersion(fu.version); err != nil {
		return false, err
	}
	if !fu.found {
		return false, nil
	}
	if err := s.compare(fu); err != nil {
		return false, err
	}
	s.recheck.due.Store(time.Now().Add(TableRecheckEvery).UnixNano())
	return true, nil
}

// TableRecheckEvery is how often a running Client checks its table again
// (tableRecheck).
const TableRecheckEvery = time.Second

// A tableRecheck checks the Client's table against schema.sql again, as the
// first use did, while the Client runs: an operator may alter it under
// running Clients. A column made DATETIME without fractions, say, cuts up
// to a second off every lease written, which no answer shows (the insert
// ids come from the BIGINT fence and marks), and gave several holders at
// once with 1s leases. So the trigger is time: the first statement that
// takes or extends a lease after TableRecheckEvery sends the first_use
// query first (one read of the table's definition, about as dear as one
// lock statement, at most once a second; twice while the Client waits for
// a name: see TableCheckAhead), and while the table differs,
// every such statement fails with the difference, wrapping s.cfg.Errors.BadTable,
// and sends nothing; it is checked again each second, so a mended table
// serves again. Changes an answer does show (the fence row gone, a mark or
// slot out of range) are reported where the answer is read. The zero value
// is due at once; checkFirstUse sets the first due time.
type tableRecheck struct {
	due     atomic.Int64 // UnixNano from which the next check is due
	running atomic.Bool  // a check is under way; other calls do not wait for it
	bad     atomic.Pointer[error]
}

// RecheckDue returns when the table's next check is due, in UnixNano.
func (s *Server) RecheckDue() int64 { return s.recheck.due.Load() }

// SetRecheckDue moves the table's next check to unixNano (the tests make it
// due now).
func (s *Server) SetRecheckDue(unixNano int64) { s.recheck.due.Store(unixNano) }

// tableStillGood returns the difference the last check found between the
// table and schema.sql, checking again first when due. A check that cannot
// read the table's definition (a lost connection, the table gone) finds no
// difference: the statement then meets the same trouble and says so.
func (s *Server) tableStillGood(ctx context.Context) error {
	return s.TableCheckAhead(ctx, 0)
}

// recheckQuiet reports, without sending anything, that the table's check
// is not due within ahead and the last one found no difference: then
// tableStillGood and Ahead have nothing to do.
func (s *Server) recheckQuiet(ahead time.Duration) bool {
	r := &s.recheck
	return time.Now().UnixNano()+int64(ahead) < r.due.Load() && r.bad.Load() == nil
}

// TableCheckAhead is tableStillGood for a caller about to wait before its
// statement: it checks already when the check comes due within ahead, so
// that the statement, sent when the wait ends, finds it fresh instead of
// sending it first, which would delay the statement by a round trip.
func (s *Server) TableCheckAhead(ctx context.Context, ahead time.Duration) error {
	r := &s.recheck
	if now := time.Now().UnixNano(); now+int64(ahead) >= r.due.Load() && r.running.CompareAndSwap(false, true) {
		r.due.Store(now + int64(TableRecheckEvery))
		defer r.running.Store(false)
		fu, err := s.readFirstUse(ctx, strings.Trim(s.cfg.Table, "`"))
		if err == nil && fu.found {
			if err := s.compare(fu); err != nil {
				err = s.cfg.Errorf("%w (found while this Client ran: the table was altered; until it is mended, no lease is taken or extended)", err)
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
func (s *Server) readFirstUse(ctx context.Context, table string) (*firstUse, error) {
	rows, err := s.cfg.DB.QueryContext(ctx, s.Text().Named("first_use"))
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
			return nil, s.cfg.Errorf("%w: cannot check the table: information_schema answered NULL for %s, which it never leaves NULL "+
				"(the first_use query, queries.sql): the server's answers cannot be trusted, so nothing is known of the table", s.cfg.Errors.Unsupported, col)
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
// wrapping Errors.BadTable that names every difference and the ALTER TABLE
// statement that mends them all, or nil.
func (s *Server) compare(fu *firstUse) error {
	table := s.cfg.Table
	var problems, fixes []string
	if !strings.EqualFold(fu.engine, "InnoDB") {
		problems = append(problems, fmt.Sprintf("the engine is %s, must be InnoDB (row locks and transactions)", fu.engine))
		fixes = append(fixes, "ENGINE=InnoDB")
	}
	for _, want := range SchemaColumns(s.cfg.NameLen, s.cfg.HolderLen) {
		got, ok := fu.columns[want.Name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("column %s is missing, must be %s", want.Name, want.Def))
			fixes = append(fixes, fmt.Sprintf("ADD COLUMN %s %s", want.Name, want.Def))
		case !want.serves(got):
			problems = append(problems, fmt.Sprintf("column %s is %s, must be %s", want.Name, got.describe(), want.Def))
			fixes = append(fixes, fmt.Sprintf("MODIFY COLUMN %s %s", want.Name, want.Def))
		}
	}
	want := strings.Join(SchemaKey, ", ")
	if pk, ok := fu.indexes["PRIMARY"]; !ok || !slices.Equal(pk.columns, SchemaKey) {
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
	return s.cfg.Errorf("%w: in %s, %s; mend it with: ALTER TABLE %s %s",
		s.cfg.Errors.BadTable, table, strings.Join(problems, "; "), table, strings.Join(fixes, ", "))
}

// serves reports whether a column found in the table works as this one.
func (want SchemaColumn) serves(got foundColumn) bool {
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
// any is prepared, once (Choose): a second call (another call's check got
// here first) changes nothing. The Client is told the forms now held
// (Config.Chosen), on every call: what it does must bear a repeat.
func (s *Server) chooseForms(version, qualified, db string, carries bool) {
	f := s.Choose(version, qualified, db, carries)
	s.noFrozenEnds(f, version)
	if s.cfg.Chosen != nil {
		s.cfg.Chosen(f, version)
	}
}

// TableProblem says what err, a statement's error, shows of the table: that
// it does not exist (and how to create it, through Vitess too), or that it
// lacks schema.sql's columns; "" for any other error.
func (s *Server) TableProblem(err error) string {
	n, ok := fault.Errno(err)
	if !ok {
		return ""
	}
	table := s.cfg.Table
	name := strings.Trim(table, "`")
	switch {
	case n == fault.NoSuchTable:
		return "table " + table + " does not exist; create it with Client.CreateTable or by running schema.sql"
	case n == fault.BadField:
		return "table " + table + " does not have the columns of schema.sql (another tool's table, or one made by hand?)"
	case n == fault.UnknownError && strings.Contains(err.Error(), "table "+name+" not found"):
		return "Vitess knows no table " + table + " in this keyspace: create it with Client.CreateTable or by running schema.sql, " +
			"in a sharded keyspace after giving it a vindex on name (ALTER VSCHEMA ON keyspace." + name + " ADD VINDEX xxhash(name) USING xxhash; docs/servers.md)"
	}
	return ""
}
