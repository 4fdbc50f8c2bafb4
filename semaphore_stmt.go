package sqllock

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// The semaphore statement (slot_acquire, queries.sql): prepared once per
// Client for each number of slot rows it visits (its text: queries.go,
// slotSQL), and how it is sent. What an unknown send may have taken is
// deleted as every kind's orphan is (orphans.go).

// slotStmts holds a Client's slot_acquire statements, prepared once per
// number of slot rows visited (at most MaxSlots of them), until Close.
type slotStmts struct {
	mu     sync.Mutex
	byText map[string]*sql.Stmt
	closed bool
}

// stmt returns the statement of text, preparing it on first use.
func (s *slotStmts) stmt(ctx context.Context, db *sql.DB, text string) (*sql.Stmt, error) {
	s.mu.Lock()
	st, closed := s.byText[text], s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if st != nil {
		return st, nil
	}
	err := fault.Transient(ctx, func() (err error) {
		st, err = db.PrepareContext(ctx, text)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.byText[text]; prev != nil || s.closed {
		_ = st.Close() // another call prepared it first, or Close came
		if s.closed {
			return nil, ErrClosed
		}
		return prev, nil
	}
	if s.byText == nil {
		s.byText = make(map[string]*sql.Stmt)
	}
	s.byText[text] = st
	return st, nil
}

// close closes the statements, for Client.Close, once its leases are
// released; a statement prepared later is closed at once.
func (s *slotStmts) close() {
	s.mu.Lock()
	stmts := s.byText
	s.byText, s.closed = nil, true
	s.mu.Unlock()
	for _, st := range stmts {
		_ = st.Close()
	}
}

func (s *slotStmts) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// execSlot sends slot_acquire's text, prepared once, about semaphore sem,
// as exec sends a statement (send): again while the server rolls it back or
// the connection breaks before the reply, each such send told to the
// Observer's Retried and the log. unknown counts the sends whose outcome is
// unknown: each may have committed, or still commit.
func (c *Client) execSlot(ctx context.Context, sem, text string, args []any) (res sql.Result, unknown int, err error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	st, err := c.slots.stmt(ctx, c.db, text)
	if err != nil {
		return nil, 0, err
	}
	if err := c.tableStillGood(ctx); err != nil {
		return nil, 0, err
	}
	return c.send(ctx, time.Time{}, "slot_acquire", sem, true, func() (sql.Result, error) {
		res, err := st.ExecContext(ctx, args...)
		if err != nil && c.slots.isClosed() {
			// "sql: statement is closed": Close closed it (send ends on
			// ErrClosed at once).
			return nil, ErrClosed
		}
		return res, err
	})
}
