package engine

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// What the proof holds the server behind the pool to before the statements
// (proof.go): that it takes writes as a primary does, that every connection
// of the pool reaches one server (or one cluster), that a row one open
// transaction wrote cannot be taken by another connection
// (rowlock.go), and that the server computes what the statements
// rely on (proof_go). Each is proven on connections of the pool at
// the Client's first write, once.
//
// The pool's connections are held at once, up to maxProofConns (fewer when
// the pool's limit is lower, or it has fewer to spare: pool.go), and
// each is asked whether it is read-only and which server it reaches
// (server_mysql, server_mariadb in queries.sql). A connection the pool
// opens later is not asked: database/sql gives no sign of a new connection
// on the path a statement takes, and asking on that path would cost every
// acquire a round trip.

// maxProofConns is how many connections of the pool the proof holds at once
// to compare the servers they reach.
const maxProofConns = 4

// serverFacts is what a connection answered about the server it reaches.
type serverFacts struct {
	readOnly string        // the read-only setting that is on ("@@read_only = 1"), or ""
	cluster  bool          // the server is a node of Galera or Group Replication
	identity string        // the server's, or its cluster's; "" where it is not asked
	rtt      time.Duration // how long the question took: a round trip, for the waits that follow
}

// FactsQuery returns, of the statements q, the query that asks a server calling itself version
// for its facts, or "" for a server whose facts are not asked: TiDB, whose
// read-only settings refuse every account, and Vitess, whose vtgate sends
// writes to each shard's primary and answers for many servers.
func FactsQuery(q sqltext.Statements, version string) string {
	switch {
	case strings.Contains(version, "TiDB"), strings.Contains(strings.ToLower(version), "vitess"):
		return ""
	case strings.Contains(version, "MariaDB"):
		return q["server_mariadb"]
	}
	return q["server_mysql"]
}

// readFacts asks conn for its server's facts. plain is set once a server
// has refused the Group Replication variable, so that the connections after
// the first ask without it.
func (s *Server) readFacts(ctx context.Context, conn *sql.Conn, version string, plain *bool) (serverFacts, error) {
	query := FactsQuery(s.cfg.Queries, version)
	if query == "" {
		return serverFacts{}, nil
	}
	if *plain && query == s.cfg.Queries["server_mysql"] {
		query = s.cfg.Queries["server_mysql_plain"]
	}
	var readOnly, superReadOnly, id, cluster sql.NullString
	err := fault.RetryRolledBack(ctx, func() error {
		return conn.QueryRowContext(ctx, query).Scan(&readOnly, &superReadOnly, &id, &cluster)
	})
	if _, ok := fault.Errno(err); ok && query == s.cfg.Queries["server_mysql"] {
		// 1193 from MySQL without the plugin; other engines say it
		// otherwise (go-mysql-server: 1105).
		*plain = true
		return s.readFacts(ctx, conn, version, plain)
	}
	if err != nil {
		if _, ok := fault.Errno(err); ok {
			return serverFacts{}, s.refuseServer(version, "it refused the query every MySQL answers about its read-only settings and identity (@@read_only, @@super_read_only, @@server_uuid): %w", err)
		}
		return serverFacts{}, err
	}
	var f serverFacts
	switch {
	case isOn(superReadOnly):
		f.readOnly = "@@super_read_only = " + superReadOnly.String
	case isOn(readOnly):
		f.readOnly = "@@read_only = " + readOnly.String
	}
	f.cluster = cluster.String != ""
	switch {
	case cluster.String != "" && strings.Contains(version, "MariaDB"):
		f.identity = "Galera cluster " + cluster.String
	case cluster.String != "":
		f.identity = "Group Replication group " + cluster.String
	case strings.Contains(version, "MariaDB"):
		f.identity = "MariaDB server (server_id, host, port, datadir) " + id.String
	default:
		f.identity = "server_uuid " + id.String
	}
	if !id.Valid || id.String == "" {
		return f, s.refuseServer(version, "it answered no identity (@@server_uuid, or MariaDB's @@server_id, @@hostname, @@port and @@datadir)")
	}
	return f, nil
}

// isOn reports whether a boolean variable's value says on.
func isOn(v sql.NullString) bool {
	switch strings.ToUpper(v.String) {
	case "", "0", "OFF":
		return false
	}
	return true
}

// refuseReadOnly returns an error wrapping Errors.ReadOnly when f says the
// server is read-only.
func (s *Server) refuseReadOnly(f serverFacts) error {
	if f.readOnly == "" {
		return nil
	}
	return fmt.Errorf("%w (%s): a replica, or a primary during a failover; a lease written there could be lost, or held by a second owner on the primary, "+
		"even where this account may write, so none was taken (the next call tries again)", s.cfg.Errors.ReadOnly, f.readOnly)
}

// refuseServer returns an error wrapping Errors.Unsupported that says
// what the server calling itself version did.
func (s *Server) refuseServer(version, format string, args ...any) error {
	return s.cfg.Errorf("%w: the server (%s), or a layer between it and this Client: "+format+
		", which MySQL and MariaDB never do, so a lease taken through it could have two owners; no lease was taken",
		append([]any{s.cfg.Errors.Unsupported, version}, args...)...)
}

// differentServers returns the error of a pool whose connections reach two
// servers, one answering as first and another as other.
func (s *Server) differentServers(version, first, other string) error {
	return s.cfg.Errorf("%w: the pool's connections reach different servers: one answers as %s, another as %s "+
		"(a load balancer over several primaries?); each would keep leases of its own, so two Clients could both hold one name; no lease was taken (version %s)",
		s.cfg.Errors.Unsupported, first, other, version)
}

// checkWritable asks conn for its server's facts before the proof writes
// anything, and refuses a read-only server: a proof name written on a
// replica by an account that may write there would be a transaction of the
// replica's own. plain is as for readFacts.
func (s *Server) checkWritable(ctx context.Context, conn *sql.Conn, version string, plain *bool) (serverFacts, error) {
	start := time.Now()
	first, err := s.readFacts(ctx, conn, version, plain)
	first.rtt = time.Since(start)
	if err != nil {
		return serverFacts{}, err
	}
	if first.cluster {
		s.clustered.Store(true)
	}
	return first, s.refuseReadOnly(first)
}

// proveServer proves the rest on conn, whose server answered first, after
// the statements' own proof has shown each statement's answers: one server
// behind the pool's connections, the row lock between two of them, and
// the semantics of proof_go, under name, with tokens a and b.
func (s *Server) proveServer(ctx context.Context, conn *sql.Conn, text *[NumStmts]string, version string, first serverFacts, plain *bool, name, a, b string) error {
	owner, err := s.proveConns(ctx, conn, text, version, first, plain, name, a, b)
	if err != nil {
		return err
	}
	taker := b
	if owner == b {
		taker = a
	}
	if owner == "" {
		owner = a // no other connection: the name is still free
	}
	if err := s.proveEngine(ctx, conn, text, version, name, owner, taker); err != nil {
		return err
	}
	return fault.RetryRolledBack(ctx, func() error {
		_, err := conn.ExecContext(ctx, s.Text().Substitute(s.cfg.Queries["proof_clear"]), name)
		return err
	})
}

// proveConns holds more connections of the pool, those it has to spare
// (pool.go), asks each for its server's facts, holds them to first's,
// and proves the row lock between conn and the second. It returns the token
// whose lease the name then has, or "" when the pool had no connection to
// spare: then a later acquire proves the rest.
func (s *Server) proveConns(ctx context.Context, conn *sql.Conn, text *[NumStmts]string, version string, first serverFacts, plain *bool, name, a, b string) (string, error) {
	n := maxProofConns
	if limit := s.cfg.DB.Stats().MaxOpenConnections; limit > 0 {
		n = min(n, limit)
	}
	var others []*sql.Conn
	defer func() {
		for _, o := range others {
			_ = o.Close()
		}
	}()
	wait := spareWait(first.rtt)
	var rtt time.Duration
	for len(others) < n-1 {
		o, err := s.spareConn(ctx, wait)
		if err != nil {
			return "", err
		}
		if o == nil {
			break
		}
		others = append(others, o)
		start := time.Now()
		if err := s.sameServer(ctx, o, version, first, plain); err != nil {
			return "", err
		}
		if len(others) == 1 {
			rtt = time.Since(start)
		}
	}
	if len(others) == 0 {
		s.deferPoolProof(version, first, *plain)
		return "", nil
	}
	return s.proveConcurrency(ctx, conn, others[0], rtt, text, version, name, a, b)
}

// sameServer asks o for its server's facts and holds them to first's: a
// writable server, the one the first connection reaches.
func (s *Server) sameServer(ctx context.Context, o *sql.Conn, version string, first serverFacts, plain *bool) error {
	f, err := s.readFacts(ctx, o, version, plain)
	if _, ok := fault.Errno(err); ok {
		// Perhaps another kind of server, which refused the query
		// made for the first's kind.
		var v string
		if verr := o.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); verr == nil && v != version {
			return s.differentServers(version, first.identity, "a server of version "+v)
		}
	}
	if err != nil {
		return err
	}
	if err := s.refuseReadOnly(f); err != nil {
		return err
	}
	if f.identity != first.identity {
		return s.differentServers(version, first.identity, f.identity)
	}
	return nil
}
