package sqllocktest

// Tables, rows, row locks and transactions. A table holds schema.sql's rows
// by primary key (name, kind). A statement runs whole under the server's
// mutex, so each is atomic; a transaction (Lock.Check's) keeps the rows it
// wrote locked until it ends, as InnoDB does, and other connections read
// those rows as they were when it began writing them (InnoDB's consistent
// read of the last committed version).

type rowKey struct {
	name string
	kind byte
}

// row is one row of schema.sql; times are microseconds since 1970, UTC.
type row struct {
	owner, holder     string
	fence             uint64
	acquired, expires int64
}

type table struct {
	rows map[rowKey]*row
}

func newTable() *table { return &table{rows: map[rowKey]*row{}} }

// rowRef names a row in a table.
type rowRef struct {
	table string
	key   rowKey
}

// A txn is a connection's open transaction.
type txn struct {
	before   map[rowRef]*row // each row written, as it was committed; nil when absent
	order    []rowRef
	readOnly bool
	user     *Tx // the Handler's statements' transaction, if any ran
}

func copyRow(r *row) *row {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// read returns the row as connection c sees it, a copy; nil when absent.
func (s *Server) read(c *conn, ref rowRef) *row {
	t := s.tables[ref.table]
	if t == nil {
		return nil
	}
	if h := s.rowLks[ref]; h != nil && h != c && h.tx != nil {
		if before, ok := h.tx.before[ref]; ok {
			return copyRow(before)
		}
	}
	return copyRow(t.rows[ref.key])
}

// keys returns the keys of table name that c may see: the rows there and
// the committed rows other transactions deleted.
func (s *Server) keys(c *conn, name string) []rowKey {
	t := s.tables[name]
	if t == nil {
		return nil
	}
	seen := map[rowKey]bool{}
	var out []rowKey
	for k := range t.rows {
		seen[k] = true
		out = append(out, k)
	}
	for ref, h := range s.rowLks {
		if ref.table == name && h != c && h.tx != nil && !seen[ref.key] {
			if r, ok := h.tx.before[ref]; ok && r != nil {
				seen[ref.key] = true
				out = append(out, ref.key)
			}
		}
	}
	return out
}

// write puts r (nil: deletes the row) as connection c's write: inside a
// transaction it locks the row and keeps its committed image for rollback.
// It reports whether the row changed.
func (s *Server) write(c *conn, ref rowRef, r *row) bool {
	t := s.tables[ref.table]
	old := t.rows[ref.key]
	s.undo = append(s.undo, undoEntry{ref, copyRow(old)})
	if c.tx != nil {
		if _, ok := c.tx.before[ref]; !ok {
			c.tx.before[ref] = copyRow(old)
			c.tx.order = append(c.tx.order, ref)
		}
		s.rowLks[ref] = c
	}
	if r == nil {
		delete(t.rows, ref.key)
		return old != nil
	}
	t.rows[ref.key] = copyRow(r)
	return old == nil || *old != *r
}

// lockRow locks a row c read FOR UPDATE, inside a transaction.
func (s *Server) lockRow(c *conn, ref rowRef) {
	if c.tx != nil {
		s.rowLks[ref] = c
	}
}

// blocker returns the connection whose transaction holds one of refs
// locked, other than c, or nil.
func (s *Server) blocker(c *conn, refs []rowRef) *conn {
	for _, ref := range refs {
		if h := s.rowLks[ref]; h != nil && h != c {
			return h
		}
	}
	return nil
}

// endTx commits (or rolls back) c's transaction and frees its locks.
func (s *Server) endTx(c *conn, commit bool) {
	tx := c.tx
	if tx == nil {
		return
	}
	if !commit {
		for i := len(tx.order) - 1; i >= 0; i-- {
			ref := tx.order[i]
			t := s.tables[ref.table]
			if t == nil {
				continue
			}
			if r := tx.before[ref]; r != nil {
				t.rows[ref.key] = r
			} else {
				delete(t.rows, ref.key)
			}
		}
	}
	for ref, h := range s.rowLks {
		if h == c {
			delete(s.rowLks, ref)
		}
	}
	c.tx = nil
	endUserTx(tx, commit)
	s.broadcast()
}

// An undoEntry is a row as it was before the running statement wrote it: a
// statement that fails undoes its writes, so that it changes nothing, as a
// statement does on InnoDB.
type undoEntry struct {
	ref rowRef
	row *row // nil: absent
}

// undoStatement puts back what the failed statement wrote; s.mu is held.
func (s *Server) undoStatement() {
	for i := len(s.undo) - 1; i >= 0; i-- {
		u := s.undo[i]
		if t := s.tables[u.ref.table]; t != nil {
			if u.row != nil {
				t.rows[u.ref.key] = u.row
			} else {
				delete(t.rows, u.ref.key)
			}
		}
	}
	s.undo = s.undo[:0]
}
