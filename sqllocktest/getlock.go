package sqllocktest

import (
	"crypto/sha256"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"time"
)

// GET_LOCK and its kin, as the wake-up channels use them (internal/wait/channel.go in the
// library): named locks held by a connection, freed when it releases them
// or ends, granted to waiters in the order they came. GET_LOCK's timeout
// runs on the machine's clock, as on a real server, not on the server's
// clock that leases use.

type namedLock struct {
	table   string // whose wake_wait statements name it
	owner   *conn
	count   int // GET_LOCK is re-entrant on one connection
	waiters []*conn
}

// channelName is the lock's name as the statement computes it:
// CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), table, name), 256), 56)).
func channelName(table, name string) string {
	sum := sha256.Sum256([]byte(Database + "\x00" + table + "\x00" + name))
	return "sqllock:" + hex.EncodeToString(sum[:])[:56]
}

// wake_wait: IS_FREE_LOCK, then GET_LOCK with a timeout in seconds (a
// negative one waits for ever).
func wakeWait(x *call) (*outcome, error) {
	if len(x.p.lits) != 3 || x.p.lits[0] != x.p.lits[1] {
		return nil, errSyntax("the wake_wait statement's literals")
	}
	key := channelName(x.p.table, x.p.lits[0])
	secs, _ := strconv.ParseInt(x.p.lits[2], 10, 64)
	free := x.s.named[key] == nil
	if x.s.noLocks {
		return nil, errGetLockRefused
	}
	got, err := x.s.getLock(x, key, secs)
	if err != nil {
		return nil, err
	}
	return &outcome{cols: []string{"free", "got"}, rows: [][]driver.Value{{boolValue(free), boolValue(got)}}}, nil
}

// wake_release: RELEASE_LOCK: 1 when this connection held it, 0 when
// another does, NULL when nobody does.
func wakeRelease(x *call) (*outcome, error) {
	key := channelName(x.p.table, x.p.lits[0])
	out := &outcome{cols: []string{"released"}}
	l := x.s.named[key]
	switch {
	case l == nil:
		out.rows = [][]driver.Value{{nil}}
	case l.owner != x.c:
		out.rows = [][]driver.Value{{int64(0)}}
	default:
		l.count--
		if l.count == 0 {
			x.s.handOn(key, l)
		}
		out.rows = [][]driver.Value{{int64(1)}}
	}
	return out, nil
}

// wake_probe: IS_USED_LOCK: the holder's connection id, or NULL.
func wakeProbe(x *call) (*outcome, error) {
	out := &outcome{cols: []string{"holder"}, rows: [][]driver.Value{{nil}}}
	if l := x.s.named[channelName(x.p.table, x.p.lits[0])]; l != nil {
		out.rows[0][0] = l.owner.id
	}
	return out, nil
}

// wake_holder: IS_USED_LOCK of the channel named by table and name, bound.
func wakeHolder(x *call) (*outcome, error) {
	a, err := x.strs(0, 1)
	if err != nil {
		return nil, err
	}
	out := &outcome{cols: []string{"holder"}, rows: [][]driver.Value{{nil}}}
	if l := x.s.named[channelName(a[0], a[1])]; l != nil {
		out.rows[0][0] = l.owner.id
	}
	return out, nil
}

// wake_waiters: how many other connections wait in GET_LOCK for a name of
// the table bound.
func wakeWaiters(x *call) (*outcome, error) {
	a, err := x.strs(0)
	if err != nil {
		return nil, err
	}
	n := int64(0)
	for _, l := range x.s.named {
		if l.table != a[0] {
			continue
		}
		for _, w := range l.waiters {
			if w != x.c {
				n++
			}
		}
	}
	return &outcome{cols: []string{"COUNT(*)"}, rows: [][]driver.Value{{n}}}, nil
}

// getLock takes the named lock for x's connection, waiting up to secs
// seconds behind those that came first; s.mu is held.
func (s *Server) getLock(x *call, key string, secs int64) (bool, error) {
	c := x.c
	l := s.named[key]
	if l == nil {
		s.named[key] = &namedLock{table: x.p.table, owner: c, count: 1}
		return true, nil
	}
	if l.owner == c {
		l.count++
		return true, nil
	}
	var deadline time.Time
	if secs >= 0 {
		deadline = time.Now().Add(time.Duration(secs) * time.Second)
	}
	l.waiters = append(l.waiters, c)
	for {
		err := s.wait(x.ctx, deadline)
		switch {
		case c.broken:
			return false, ErrLostConnection
		case s.named[key] == l && l.owner == c:
			return true, nil
		case errors.Is(err, errTimedOut):
			s.leaveQueue(c)
			return false, nil
		case err != nil:
			s.breakConn(c) // the driver closes the connection; the server frees what it held
			return false, err
		}
	}
}

// handOn gives a freed lock to its first waiter, or forgets it.
func (s *Server) handOn(key string, l *namedLock) {
	if len(l.waiters) == 0 {
		delete(s.named, key)
	} else {
		l.owner, l.count, l.waiters = l.waiters[0], 1, l.waiters[1:]
	}
	s.broadcast()
}

// leaveQueue takes c out of every lock's queue.
func (s *Server) leaveQueue(c *conn) {
	for _, l := range s.named {
		l.waiters = slices.DeleteFunc(l.waiters, func(w *conn) bool { return w == c })
	}
}

// freeNamed frees every named lock c holds, as a server does when a
// connection ends.
func (s *Server) freeNamed(c *conn) {
	s.leaveQueue(c)
	for key, l := range s.named {
		if l.owner == c {
			s.handOn(key, l)
		}
	}
}
