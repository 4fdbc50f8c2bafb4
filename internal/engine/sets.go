package engine

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// The statements of a lease on a set of names: each acts on every lease of
// the set in one statement, sent as text, made of the set's literals.

// A Set is a set of names under one token, with the literals its
// statements are made of.
type Set struct {
	Names    []string // sorted
	Fences   []uint64 // each name's, once ReadFences has read them
	TokenLit string   // the token as a hex literal
	In       string   // the names as hex literals, comma-separated: the set's IN list
	lits     []string // each name as a hex literal
	union    string   // lits joined by " UNION ALL SELECT ": all_refresh's names
}

// NewSet returns the set of names, sorted, under token.
func NewSet(names []string, token string) *Set {
	s := &Set{Names: names, Fences: make([]uint64, len(names)), lits: make([]string, len(names)), TokenLit: sqltext.Hex(token)}
	for i, n := range names {
		s.lits[i] = sqltext.Hex(n)
	}
	s.In = strings.Join(s.lits, ", ")
	s.union = strings.Join(s.lits, " UNION ALL SELECT ")
	return s
}

// us is d in microseconds, as a number's text.
func us(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }

// SetAcquire returns the acquire of set for ttl.
func (s *Server) SetAcquire(set *Set, ttl time.Duration) string {
	return s.Text().AcquireSet(set.lits, set.TokenLit, sqltext.Hex(s.cfg.Holder), us(ttl))
}

// SetRefresh returns the statement that extends the leases of set to ttl.
func (s *Server) SetRefresh(set *Set, ttl time.Duration) string {
	return s.Text().RefreshAll(set.union, set.In, set.TokenLit, us(ttl))
}

// SetRelease returns the statement that deletes the leases of set, or with
// minHold > 0 keeps them until acquired_at + minHold; and its name in
// queries.sql.
func (s *Server) SetRelease(set *Set, minHold time.Duration) (text, stmt string) {
	if minHold > 0 {
		return s.Text().Set("all_release_at_least", us(minHold), set.TokenLit, set.In), "all_release_at_least"
	}
	return s.Text().ReleaseAll(set.TokenLit, set.In), "all_release"
}

// SetCheck returns Lock.Check's statement for set.
func (s *Server) SetCheck(set *Set) string { return s.Text().Set("all_check", set.TokenLit, set.In) }

// ReadFences sets the fences of set, just acquired, from the reply res: the
// insert id carries the set's one fence; the one-row forms (TiDB, Vitess),
// whose reply cannot carry them, read each back (queries.sql, all_fences).
func (s *Server) ReadFences(ctx context.Context, set *Set, res sql.Result) error {
	if s.Forms().OneRow {
		return s.readFencesOneRow(ctx, set)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return err
	}
	if id&1 == 0 {
		// The second pass's mark did not come through: a server whose
		// LAST_INSERT_ID() does not carry, which the first use would
		// have found.
		return fmt.Errorf("the set's fence did not come back (insert id %d)", uint64(id))
	}
	f := uint64(id) >> 1
	for i := range set.Fences {
		set.Fences[i] = f
	}
	return nil
}

// readFencesOneRow reads the fences of set, just acquired with the one-row
// form.
func (s *Server) readFencesOneRow(ctx context.Context, set *Set) error {
	found, err := s.readFencesOn(ctx, s.cfg.DB, set, fault.Transient)
	if err == nil && found != len(set.Names) {
		return fmt.Errorf("%d of the set's %d leases read back after its acquire", found, len(set.Names))
	}
	return err
}

// A querier runs a query: a *sql.DB or a *sql.Conn.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readFencesOn reads the fences of set on q (the pool, or the proof's
// connection), the query sent again as retry allows, and returns how many
// of the set's names it found.
func (s *Server) readFencesOn(ctx context.Context, q querier, set *Set, retry func(context.Context, func() error) error) (found int, err error) {
	var rows *sql.Rows
	err = retry(ctx, func() (err error) {
		rows, err = q.QueryContext(ctx, s.Text().Set("all_fences", set.TokenLit, set.In))
		return err
	})
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name  []byte
			fence uint64
		)
		if err := rows.Scan(&name, &fence); err != nil {
			return found, err
		}
		if i, ok := slices.BinarySearch(set.Names, string(name)); ok {
			set.Fences[i] = fence
			found++
		}
	}
	return found, rows.Err()
}
