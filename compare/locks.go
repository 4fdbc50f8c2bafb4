package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"strings"
	"time"

	"cirello.io/pglock"
	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-sql-driver/mysql"
	"github.com/lib/pq"
	"github.com/redis/go-redis/v9"
	"github.com/sqllock/sqllock"
)

// ttl is the lease every lock with a lease takes: far longer than any hold,
// so no lease expires during a run.
const ttl = 10 * time.Second

// maxIdle is every *sql.DB's idle pool: 64 goroutines each with a
// connection of their own (GET_LOCK, pg_advisory_lock) keep theirs.
const maxIdle = 80

// tables are the tables a run creates on each server and drops at its
// end, named after the run's tag so that runs at once do not meet.
type tables struct{ sqllock, seed, pglock string }

func tablesFor(tag string) tables {
	return tables{"sqllock_compare_" + tag, "sqllock_compare_seed_" + tag, "sqllock_compare_pglock_" + tag}
}

// sqllockVariants are the sqllock configurations each MySQL server runs,
// one row each. Adding one is a line here.
var sqllockVariants = []struct {
	label, settings string
	opts            []sqllock.Option
}{
	{"sqllock", "Acquire; default options: wake-up channels (4), ExponentialBackoff(8ms, 256ms)", nil},
	{"sqllock, no wake-ups", "Acquire; WithWakeups(0): polls on the default RetryStrategy",
		[]sqllock.Option{sqllock.WithWakeups(0)}},
	{"sqllock, polls 1-16ms", "Acquire; WithWakeups(0), WithRetry(ExponentialBackoff(1ms, 16ms))",
		[]sqllock.Option{sqllock.WithWakeups(0), sqllock.WithRetry(sqllock.ExponentialBackoff(time.Millisecond, 16*time.Millisecond))}},
}

// pglock's settings: it retries a refused acquire once per lease, and
// takes over a lease whose version has not moved in that time, so the
// lease is short here (the default is 20 s) for waiters to get a turn.
const (
	pglockLease     = time.Second
	pglockHeartbeat = 250 * time.Millisecond
)

// A kind is one lock implementation as the benchmark runs it.
type kind struct {
	key      string // unique and stable: names the kind to a child process
	label    string // the row's name
	server   string // where its state lives, filled in by describe
	addr     string // host:port it dials (or a proxy in front of it does)
	durable  bool   // the acquire is on disk before it returns
	lease    bool   // it ends by itself when its holder vanishes
	fence    bool   // each acquisition gets a number that only grows
	settings string // how it waits, stated in the results
	pairOnly bool   // no wait: only in the uncontended pair

	// setup creates what the kind needs on its server, once per run;
	// teardown drops it. Either may be nil.
	setup, teardown func(ctx context.Context, addr string) error
	// describe returns the server's name, version and address, and the
	// settings that decide how durable a write is.
	describe func(ctx context.Context, addr string) (server, durability string, err error)
	// open makes the kind's client in one process, dialling addr.
	open func(ctx context.Context, addr string) (client, error)
}

// A client is one process's instance of a lock, over its own pool.
type client interface {
	// session returns what one goroutine acquires with: the client itself
	// for a library safe for concurrent use, a pinned connection for a
	// lock that belongs to a session.
	session(ctx context.Context) (locker, error)
	close() error
}

type locker interface {
	// acquire waits for name as the library lets a user wait, until ctx
	// ends, and returns the release.
	acquire(ctx context.Context, name string) (release func(context.Context) error, err error)
	close() error
}

// shared is a client safe for concurrent use: every session is itself.
type shared struct {
	acq func(ctx context.Context, name string) (func(context.Context) error, error)
}

func (s *shared) session(context.Context) (locker, error) { return s, nil }
func (s *shared) acquire(ctx context.Context, name string) (func(context.Context) error, error) {
	return s.acq(ctx, name)
}
func (s *shared) close() error { return nil }

// sharedClient closes the client's resources; shared's own close is a
// no-op, so that closing a session leaves the client open.
type sharedClient struct {
	*shared
	closeFn func() error
}

func (s sharedClient) close() error { return s.closeFn() }

func newShared(acq func(ctx context.Context, name string) (func(context.Context) error, error), closeFn func() error) client {
	return sharedClient{&shared{acq: acq}, closeFn}
}

// targets are the servers of one run.
type targets struct {
	DSNs     []string // MySQL or MariaDB, go-sql-driver DSNs
	Redis    string   // host:port, empty for none
	Postgres string   // postgres:// URL, empty for none
	Tag      string   // names the run's tables: letters, digits and _
}

// kinds lists every lock of a run, in the order rows appear.
func (t targets) kinds() ([]kind, error) {
	if strings.Trim(t.Tag, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		return nil, fmt.Errorf("tag %q: want lower-case letters, digits and _", t.Tag)
	}
	tb := tablesFor(t.Tag)
	var ks []kind
	for i, dsn := range t.DSNs {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("DSN %q: %w", dsn, err)
		}
		m := mysqlServer{cfg: cfg, tables: tb}
		for j, v := range sqllockVariants {
			ks = append(ks, m.sqllockKind(fmt.Sprintf("sqllock%d.%d", i, j), v.label, v.settings, v.opts))
		}
		ks = append(ks, m.getLockKind(fmt.Sprintf("getlock%d", i)))
		for _, prepared := range []bool{false, true} {
			for _, recipe := range []string{"delete-insert", "select-upsert"} {
				ks = append(ks, m.seedKind(fmt.Sprintf("seed%d.%s.%v", i, recipe, prepared), recipe, prepared))
			}
		}
	}
	if t.Redis != "" {
		r := redisServer{addr: t.Redis}
		ks = append(ks, r.redislockKind(), r.redsyncKind())
	}
	if t.Postgres != "" {
		u, err := url.Parse(t.Postgres)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("postgres URL %q: want postgres://user@host:port/db", t.Postgres)
		}
		p := pgServer{u: u, tables: tb}
		ks = append(ks, p.pglockKind(), p.advisoryKind())
	}
	return ks, nil
}

func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// --- MySQL and MariaDB: sqllock, GET_LOCK, the seed recipes ---

type mysqlServer struct {
	cfg    *mysql.Config
	tables tables
}

func (m mysqlServer) openDB(addr string) (*sql.DB, error) {
	cfg := m.cfg.Clone()
	cfg.Addr = addr
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(maxIdle)
	return db, nil
}

// with runs f on a pool of its own, for setup and teardown.
func (m mysqlServer) with(addr string, f func(*sql.DB) error) error {
	db, err := m.openDB(addr)
	if err != nil {
		return err
	}
	defer db.Close()
	return f(db)
}

func (m mysqlServer) base(key, label string) kind {
	return kind{
		key: key, label: label, addr: m.cfg.Addr,
		describe: func(ctx context.Context, addr string) (string, string, error) {
			var v, flush, logBin, syncBinlog string
			err := m.with(addr, func(db *sql.DB) error {
				return db.QueryRowContext(ctx, "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog").
					Scan(&v, &flush, &logBin, &syncBinlog)
			})
			if err != nil {
				return "", "", err
			}
			name := "MySQL"
			if strings.Contains(strings.ToLower(v), "mariadb") {
				name = "MariaDB"
			}
			v, _, _ = strings.Cut(v, "-")
			return fmt.Sprintf("%s %s %s", name, v, m.cfg.Addr),
				fmt.Sprintf("innodb_flush_log_at_trx_commit=%s, log_bin=%s, sync_binlog=%s", flush, logBin, syncBinlog), nil
		},
	}
}

func (m mysqlServer) sqllockKind(key, label, settings string, opts []sqllock.Option) kind {
	k := m.base(key, label)
	k.durable, k.lease, k.fence = true, true, true
	k.settings = settings
	k.setup = func(ctx context.Context, addr string) error {
		return m.with(addr, func(db *sql.DB) error {
			c, err := sqllock.New(db, sqllock.WithTable(m.tables.sqllock))
			if err != nil {
				return err
			}
			defer c.Close()
			return c.CreateTable(ctx)
		})
	}
	k.teardown = m.drop(m.tables.sqllock)
	k.open = func(ctx context.Context, addr string) (client, error) {
		db, err := m.openDB(addr)
		if err != nil {
			return nil, err
		}
		c, err := sqllock.New(db, append([]sqllock.Option{sqllock.WithTable(m.tables.sqllock)}, opts...)...)
		if err != nil {
			db.Close()
			return nil, err
		}
		return newShared(func(ctx context.Context, name string) (func(context.Context) error, error) {
			l, err := c.Acquire(ctx, name, ttl)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}, func() error { return errors.Join(c.Close(), db.Close()) }), nil
	}
	return k
}

func (m mysqlServer) drop(table string) func(ctx context.Context, addr string) error {
	return func(ctx context.Context, addr string) error {
		return m.with(addr, func(db *sql.DB) error {
			_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`")
			return err
		})
	}
}

// getLockTimeout is GET_LOCK's wait in seconds; a wait that times out is
// sent again.
const getLockTimeout = 10

func (m mysqlServer) getLockKind(key string) kind {
	k := m.base(key, "GET_LOCK")
	k.settings = fmt.Sprintf("GET_LOCK(name, %d) on a pinned connection, waits on the server; RELEASE_LOCK", getLockTimeout)
	k.open = func(ctx context.Context, addr string) (client, error) {
		db, err := m.openDB(addr)
		if err != nil {
			return nil, err
		}
		return &pinnedClient{db: db, get: "SELECT GET_LOCK(?, ?)", rel: "SELECT RELEASE_LOCK(?)",
			args: func(name string) []any { return []any{name} }, timeout: getLockTimeout}, nil
	}
	return k
}

// pinnedClient is a session lock (GET_LOCK, pg_advisory_lock): each
// session pins a connection and prepares its two statements on it.
type pinnedClient struct {
	db       *sql.DB
	get, rel string
	args     func(name string) []any
	timeout  int // passed after the name to get when nonzero
}

func (p *pinnedClient) close() error { return p.db.Close() }

func (p *pinnedClient) session(ctx context.Context) (locker, error) {
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	get, err := conn.PrepareContext(ctx, p.get)
	if err != nil {
		conn.Close()
		return nil, err
	}
	rel, err := conn.PrepareContext(ctx, p.rel)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &pinned{p: p, conn: conn, get: get, rel: rel}, nil
}

type pinned struct {
	p        *pinnedClient
	conn     *sql.Conn
	get, rel *sql.Stmt
}

func (s *pinned) close() error {
	s.get.Close()
	s.rel.Close()
	return s.conn.Close()
}

func (s *pinned) acquire(ctx context.Context, name string) (func(context.Context) error, error) {
	args := s.p.args(name)
	if s.p.timeout > 0 {
		args = append(args, s.p.timeout)
	}
	for {
		var ok sql.NullBool
		if err := s.get.QueryRowContext(ctx, args...).Scan(&ok); err != nil {
			return nil, err
		}
		if ok.Valid && ok.Bool {
			break
		}
		if !ok.Valid {
			return nil, fmt.Errorf("%s returned NULL", s.p.get)
		}
		// GET_LOCK timed out: wait again.
	}
	return func(ctx context.Context) error {
		var ok sql.NullBool
		if err := s.rel.QueryRowContext(ctx, s.p.args(name)...).Scan(&ok); err != nil {
			return err
		}
		if !ok.Bool {
			return fmt.Errorf("%s: not held", s.p.rel)
		}
		return nil
	}, nil
}

// The seed recipes: the hand-written lease locks people write, as
// bench_test.go in the library defines them (restated here, since a test
// file cannot be imported), on a one-row-per-name table of their own:
//
//   - delete-insert: delete the name's row if it has expired, insert a row
//     (a duplicate key means someone holds it), delete it to release;
//   - select-upsert: read the row, and if it is absent or expired write it
//     with INSERT ... ON DUPLICATE KEY UPDATE, then release by setting its
//     expiry to now.
//
// They have no wait and are only timed uncontended, as written
// (db.ExecContext, which prepares, executes and closes a statement each
// time) and with their statements prepared once.
func (m mysqlServer) seedKind(key, recipe string, prepared bool) kind {
	label := "seed " + recipe
	settings := "recipe as written: db.ExecContext per statement"
	if prepared {
		label += ", prepared"
		settings = "recipe over statements prepared once"
	}
	k := m.base(key, label)
	k.durable, k.lease = true, true
	k.settings = settings
	k.pairOnly = true
	k.setup = func(ctx context.Context, addr string) error {
		return m.with(addr, func(db *sql.DB) error {
			_, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS `"+m.tables.seed+"`"+
				" (name VARBINARY(255) PRIMARY KEY, owner VARBINARY(32) NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB")
			return err
		})
	}
	k.teardown = m.drop(m.tables.seed)
	k.open = func(ctx context.Context, addr string) (client, error) {
		db, err := m.openDB(addr)
		if err != nil {
			return nil, err
		}
		r, err := newSeedRecipe(ctx, db, m.tables.seed, recipe, prepared)
		if err != nil {
			db.Close()
			return nil, err
		}
		return newShared(r.acquire, func() error { r.closeStmts(); return db.Close() }), nil
	}
	return k
}

type seedRecipe struct {
	db     *sql.DB
	recipe string
	stmts  map[string]*sql.Stmt // by query text; nil when not prepared

	delExpired, insert, del string
	sel, upsert, expire     string
}

func newSeedRecipe(ctx context.Context, db *sql.DB, table, recipe string, prepared bool) (*seedRecipe, error) {
	t := "`" + table + "`"
	r := &seedRecipe{
		db:         db,
		recipe:     recipe,
		delExpired: "DELETE FROM " + t + " WHERE name = ? AND expires_at < UTC_TIMESTAMP(6)",
		insert:     "INSERT INTO " + t + " (name, owner, expires_at) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)",
		del:        "DELETE FROM " + t + " WHERE name = ? AND owner = ?",
		sel:        "SELECT owner, expires_at > UTC_TIMESTAMP(6) FROM " + t + " WHERE name = ?",
		upsert: "INSERT INTO " + t + " (name, owner, expires_at) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)" +
			" ON DUPLICATE KEY UPDATE owner = ?, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND",
		expire: "UPDATE " + t + " SET expires_at = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ?",
	}
	if prepared {
		r.stmts = make(map[string]*sql.Stmt)
		for _, q := range []string{r.delExpired, r.insert, r.del, r.sel, r.upsert, r.expire} {
			st, err := db.PrepareContext(ctx, q)
			if err != nil {
				r.closeStmts()
				return nil, err
			}
			r.stmts[q] = st
		}
	}
	return r, nil
}

func (r *seedRecipe) closeStmts() {
	for _, st := range r.stmts {
		st.Close()
	}
}

func (r *seedRecipe) exec(ctx context.Context, q string, args ...any) error {
	var err error
	if st := r.stmts[q]; st != nil {
		_, err = st.ExecContext(ctx, args...)
	} else {
		_, err = r.db.ExecContext(ctx, q, args...)
	}
	return err
}

func (r *seedRecipe) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	if st := r.stmts[q]; st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return r.db.QueryRowContext(ctx, q, args...)
}

var errHeld = errors.New("held by another")

func (r *seedRecipe) acquire(ctx context.Context, name string) (func(context.Context) error, error) {
	token := newToken()
	us := ttl.Microseconds()
	if r.recipe == "delete-insert" {
		if err := r.exec(ctx, r.delExpired, name); err != nil {
			return nil, err
		}
		if err := r.exec(ctx, r.insert, name, token, us); err != nil {
			return nil, err // a duplicate key: held
		}
		return func(ctx context.Context) error { return r.exec(ctx, r.del, name, token) }, nil
	}
	var owner string
	var live bool
	switch err := r.queryRow(ctx, r.sel, name).Scan(&owner, &live); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return nil, err
	case live:
		return nil, errHeld
	}
	if err := r.exec(ctx, r.upsert, name, token, us, token, us); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return r.exec(ctx, r.expire, name, token) }, nil
}

// --- Redis: bsm/redislock and go-redsync ---

type redisServer struct{ addr string }

func (r redisServer) base(key, label string) kind {
	return kind{
		key: key, label: label, addr: r.addr, lease: true,
		describe: func(ctx context.Context, addr string) (string, string, error) {
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			info, err := c.Info(ctx, "server").Result()
			if err != nil {
				return "", "", err
			}
			server := "Redis " + r.addr
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
					server = "Redis " + strings.TrimSpace(v) + " " + r.addr
				}
			}
			var durability []string
			for _, key := range []string{"appendonly", "appendfsync"} {
				v := "unknown" // CONFIG may be disabled
				if m, err := c.ConfigGet(ctx, key).Result(); err == nil && m[key] != "" {
					v = m[key]
				}
				durability = append(durability, key+"="+v)
			}
			return server, strings.Join(durability, ", "), nil
		},
	}
}

func (r redisServer) redislockKind() kind {
	k := r.base("redislock", "bsm/redislock")
	k.settings = "Obtain with a new ExponentialBackoff(16ms, 256ms) per call (its recommended least 16ms), called again when it gives up"
	k.open = func(ctx context.Context, addr string) (client, error) {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		c := redislock.New(rdb)
		return newShared(func(ctx context.Context, name string) (func(context.Context) error, error) {
			for {
				// The strategy counts its calls, so each Obtain needs its own.
				l, err := c.Obtain(ctx, name, ttl, &redislock.Options{
					RetryStrategy: redislock.ExponentialBackoff(16*time.Millisecond, 256*time.Millisecond)})
				if errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
					continue
				}
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			}
		}, rdb.Close), nil
	}
	return k
}

func (r redisServer) redsyncKind() kind {
	k := r.base("redsync", "go-redsync")
	k.settings = "Mutex.LockContext with the defaults (32 tries, 50-250 ms apart), called again when it gives up; one Redis"
	k.open = func(ctx context.Context, addr string) (client, error) {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		rs := redsync.New(goredis.NewPool(rdb))
		return newShared(func(ctx context.Context, name string) (func(context.Context) error, error) {
			m := rs.NewMutex(name, redsync.WithExpiry(ttl))
			for {
				err := m.LockContext(ctx)
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return nil, errors.Join(ctx.Err(), err)
				}
				// The last try's refusal comes back as an error of its own.
				var taken *redsync.ErrTaken
				var nodeTaken *redsync.ErrNodeTaken
				if !errors.Is(err, redsync.ErrFailed) && !errors.As(err, &taken) && !errors.As(err, &nodeTaken) {
					return nil, err
				}
			}
			return func(ctx context.Context) error {
				ok, err := m.UnlockContext(ctx)
				if err == nil && !ok {
					err = errors.New("redsync: unlock found the lock gone")
				}
				return err
			}, nil
		}, rdb.Close), nil
	}
	return k
}

// --- PostgreSQL: cirello.io/pglock and advisory locks ---

type pgServer struct {
	u      *url.URL
	tables tables
}

func (p pgServer) openDB(addr string) (*sql.DB, error) {
	u := *p.u
	u.Host = addr
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(maxIdle)
	return db, nil
}

// with runs f on a pool of its own, for setup and teardown.
func (p pgServer) with(addr string, f func(*sql.DB) error) error {
	db, err := p.openDB(addr)
	if err != nil {
		return err
	}
	defer db.Close()
	return f(db)
}

func (p pgServer) base(key, label string) kind {
	return kind{
		key: key, label: label, addr: p.u.Host,
		describe: func(ctx context.Context, addr string) (string, string, error) {
			var v, fsync, syncCommit string
			err := p.with(addr, func(db *sql.DB) error {
				return db.QueryRowContext(ctx, "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')").
					Scan(&v, &fsync, &syncCommit)
			})
			if err != nil {
				return "", "", err
			}
			v, _, _ = strings.Cut(v, " ")
			return "PostgreSQL " + v + " " + p.u.Host, "fsync=" + fsync + ", synchronous_commit=" + syncCommit, nil
		},
	}
}

func (p pgServer) pglockClient(db *sql.DB) (*pglock.Client, error) {
	return pglock.New(db, pglock.WithCustomTable(p.tables.pglock),
		pglock.WithLeaseDuration(pglockLease), pglock.WithHeartbeatFrequency(pglockHeartbeat))
}

func (p pgServer) pglockKind() kind {
	k := p.base("pglock", "cirello.io/pglock")
	// The record version comes from a sequence and grows with every
	// acquire and heartbeat: a usable fence.
	k.durable, k.lease, k.fence = true, true, true
	k.settings = fmt.Sprintf("AcquireContext; lease %v, heartbeat %v (it retries once per lease)", pglockLease, pglockHeartbeat)
	k.setup = func(ctx context.Context, addr string) error {
		return p.with(addr, func(db *sql.DB) error {
			c, err := p.pglockClient(db)
			if err != nil {
				return err
			}
			err = c.TryCreateTable()
			var pqErr *pq.Error
			if errors.As(err, &pqErr) && pqErr.Code == "42P07" { // duplicate_table
				err = nil
			}
			return err
		})
	}
	k.teardown = func(ctx context.Context, addr string) error {
		return p.with(addr, func(db *sql.DB) error {
			_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+p.tables.pglock+" CASCADE")
			return err
		})
	}
	k.open = func(ctx context.Context, addr string) (client, error) {
		db, err := p.openDB(addr)
		if err != nil {
			return nil, err
		}
		c, err := p.pglockClient(db)
		if err != nil {
			db.Close()
			return nil, err
		}
		return newShared(func(ctx context.Context, name string) (func(context.Context) error, error) {
			// pglock's heartbeat lives as long as the context given to
			// AcquireContext, so a wait with a deadline would end the
			// lease with it: wait with a context of its own, and give up
			// the wait (and any lease taken late) when ctx ends.
			type res struct {
				l   *pglock.Lock
				err error
			}
			got := make(chan res, 1)
			wait, stop := context.WithCancel(context.WithoutCancel(ctx))
			go func() {
				l, err := c.AcquireContext(wait, name)
				got <- res{l, err}
			}()
			select {
			case r := <-got:
				if r.err != nil {
					stop()
					return nil, r.err
				}
				return func(ctx context.Context) error {
					defer stop()
					return c.ReleaseContext(ctx, r.l)
				}, nil
			case <-ctx.Done():
				stop()
				if r := <-got; r.err == nil {
					c.ReleaseContext(context.Background(), r.l)
				}
				return nil, ctx.Err()
			}
		}, db.Close), nil
	}
	return k
}

func (p pgServer) advisoryKind() kind {
	k := p.base("pgadvisory", "PostgreSQL advisory lock")
	k.settings = "pg_advisory_lock(key) on a pinned connection, waits on the server; pg_advisory_unlock"
	k.open = func(ctx context.Context, addr string) (client, error) {
		db, err := p.openDB(addr)
		if err != nil {
			return nil, err
		}
		return &pinnedClient{db: db, get: "SELECT true FROM pg_advisory_lock($1)", rel: "SELECT pg_advisory_unlock($1)",
			args: func(name string) []any { return []any{advisoryKey(name)} }}, nil
	}
	return k
}

// advisoryKey maps a name to the 64-bit key pg_advisory_lock takes.
func advisoryKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}
