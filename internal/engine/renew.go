package engine

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// The statements of a Client's shared renewal (queries.sql, renew_many and
// renew_found): many leases, each named by its row and its owner, in one
// statement sent as text.

// The bounds of one shared renewal. Where the server is told to read an IN
// list of any length by key (Forms.LargeIn), a statement carries up to
// largeRenewRows leases (100,000 in three), as many as the Client finds
// the server answers quickly (the root's fitRows); elsewhere up to
// SmallRenewRows, within what MySQL 5.7's range optimizer plans by
// default, the bounds every server takes. Bytes: within the default
// max_allowed_packet of those servers (MariaDB's 16 MiB, MySQL 8.0's
// 64 MiB; 5.7's 4 MiB).
const (
	largeRenewRows  = 34000
	largeRenewBytes = 8 << 20
	SmallRenewRows  = 4096
	SmallRenewBytes = 1 << 20
)

// RenewLimits returns how many lease rows, and how many bytes of their
// literals, one shared renewal may carry on this server.
func (s *Server) RenewLimits() (rows, bytes int) {
	if !s.Forms().LargeIn {
		return SmallRenewRows, SmallRenewBytes
	}
	return largeRenewRows, largeRenewBytes
}

// A RenewLit is one lease row, named and held by its owner, as renew_many
// and renew_found carry it: its name's literal, its owner's and name's
// (Pair), and the owner and name concatenated (Key), as renew_found answers.
// A Client renders each once, when the lease joins the shared renewal, not
// at every round.
type RenewLit struct{ Name, Pair, Key string }

// NewRenewLit returns the literals of the lease row name held by owner.
func NewRenewLit(name, owner string) RenewLit {
	key := owner + name
	return RenewLit{Name: sqltext.Hex(name), Pair: sqltext.Hex(key), Key: key}
}

// Bytes is how many bytes of renew_many's text the row adds: its literals
// and their separators.
func (l RenewLit) Bytes() int { return len(l.Name) + len(l.Pair) + 4 }

// RenewMany returns the shared renewal for ttl of the lease rows lits
// (queries.sql, renew_many).
func (s *Server) RenewMany(ttl time.Duration, lits []RenewLit) string {
	names, pairs := renewLists(lits)
	return s.renewText("renew_many", us(ttl), names, pairs)
}

// RenewFound returns which of the lease rows lits are their owner's and
// live now, each by its Key (queries.sql, renew_found); the query is sent
// again as fault.Transient allows.
func (s *Server) RenewFound(ctx context.Context, lits []RenewLit) (map[string]bool, error) {
	return s.found(ctx, s.RenewFoundText(lits))
}

// found runs q, which lists owner-and-name keys, and returns them.
func (s *Server) found(ctx context.Context, q string) (map[string]bool, error) {
	found := map[string]bool{}
	err := fault.Transient(ctx, func() error {
		clear(found)
		rs, err := s.cfg.DB.QueryContext(ctx, q)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var pair []byte
			if err := rs.Scan(&pair); err != nil {
				return err
			}
			found[string(pair)] = true
		}
		return rs.Err()
	})
	return found, err
}

// RenewFoundText returns the query RenewFound sends.
func (s *Server) RenewFoundText(lits []RenewLit) string {
	names, pairs := renewLists(lits)
	return s.renewText("renew_found", names, pairs)
}

// renewText returns statement name with lits in place, on MariaDB 10.5.9
// and later after the prefix that lets it read a long IN list by key.
func (s *Server) renewText(name string, lits ...string) string {
	f := s.Forms()
	q := f.Text().Set(name, lits...)
	if f.LargeIn && f.LockWait {
		q = f.q["renew_many_mariadb"] + "\n" + q
	}
	return q
}

// renewLists returns the literal lists of renew_many and renew_found: the
// names, and each owner and name concatenated.
func renewLists(lits []RenewLit) (names, pairs string) {
	var n, p strings.Builder
	ns, ps := 0, 0
	for _, l := range lits {
		ns += len(l.Name) + 2
		ps += len(l.Pair) + 2
	}
	n.Grow(ns)
	p.Grow(ps)
	for i, l := range lits {
		if i > 0 {
			n.WriteString(", ")
			p.WriteString(", ")
		}
		n.WriteString(l.Name)
		p.WriteString(l.Pair)
	}
	return n.String(), p.String()
}

// mariaDBAtLeast reports whether version, as MariaDB's VERSION() answers
// ("10.11.9-MariaDB-log"), is major.minor.patch or later.
func mariaDBAtLeast(version string, want ...int) bool {
	v, _, _ := strings.Cut(strings.TrimPrefix(version, "5.5.5-"), "-")
	parts := strings.Split(v, ".")
	for i, w := range want {
		if i >= len(parts) {
			return false
		}
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return false
		}
		if n != w {
			return n > w
		}
	}
	return true
}

// Sessions reports whether the Client may keep sessions on this server
// (queries.sql, Sessions): the two-row forms, proven, on a server that is
// not one node of a cluster whose every node takes writes. A session's
// renewal writes the session's row and a takeover only the lease's, so a
// cluster that certifies written rows (Galera, Group Replication) would
// not order the two across nodes; TiDB's and Vitess's one-row forms read
// no session.
func (s *Server) Sessions() bool {
	f := s.Forms()
	return f.Proven && !f.OneRow && !f.TiDB && !s.clustered.Load()
}

// SessionText returns session statement name (session_open, session_renew,
// session_close) with the literals lits in place of its holes.
func (s *Server) SessionText(name string, lits ...string) string {
	return s.Forms().Text().Set(name, lits...)
}

// SessionAttach returns session_attach of the lease rows lits to the session
// named session.
func (s *Server) SessionAttach(session string, lits []RenewLit) string {
	names, pairs := renewLists(lits)
	h := sqltext.Hex(session)
	return s.renewText("session_attach", h, h, names, pairs)
}

// SessionDetach returns session_detach of the lease rows lits.
func (s *Server) SessionDetach(lits []RenewLit) string {
	names, pairs := renewLists(lits)
	return s.renewText("session_detach", names, pairs)
}

// SessionFound returns which of the lease rows lits are their owner's and
// attached, each by its Key (queries.sql, session_found); the query is sent
// again as fault.Transient allows.
func (s *Server) SessionFound(ctx context.Context, lits []RenewLit) (map[string]bool, error) {
	names, pairs := renewLists(lits)
	return s.found(ctx, s.renewText("session_found", names, pairs))
}
