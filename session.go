package sqllock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// A Client's sessions (queries.sql, Sessions). The keep-alives of one ttl
// share a session: one row, renewed once a round, that keeps alive every
// lease attached to it, however many. A lease on one name, on a set or on
// a semaphore's slot is attached in the round after renew_many first
// extends it, if its token begins with the session's name (every token the
// Client draws for a lease of that ttl does: renewals.token), and stays attached
// until its Lock refreshes it (which detaches it: queries.sql, refresh,
// all_refresh) or it is released: a set's leases all together
// (renewReq.allFound). From then on a round sends one statement for all of
// them: session_renew. Its answer moves each attached lease's deadline as
// renew_many's does; it carries the count of changes others made to the
// session's leases (a forced release), and when that moves, session_found
// tells which lease went, and that keep-alive alone is told, to refresh on
// its own. When the session has ended, every attached keep-alive is told so,
// and refreshes on its own, which finds its lease lost: no lease is held
// past what its holder was told, as each keep-alive's deadline still ends
// its contexts a margin before its ValidUntil if no renewal comes back.
// Where the server keeps no session (engine.Sessions:
// TiDB, Vitess, Galera, Group Replication), or refuses one, every lease
// renews with renew_many.

// sessionChars is how many hex digits name a session: the first of each
// token the Client draws for a lease of the session's ttl.
const sessionChars = 16

// sessionLookEvery is how many rounds apart a session's leases are looked
// at (session_found) even when its count of changes has not moved: a lease
// row changed by hand (a DELETE, an UPDATE of its owner) is not counted,
// and would be kept for its holder until its session ended. Every 6 rounds
// (2 ttl) costs a read of each attached row, not a write
// (docs/performance.md).
const sessionLookEvery = 6

// A session is a Client's session for the keep-alives of one ttl. The
// round of its ttl alone uses changes and rounds, and writes open under
// the renewals' mu; name is read and replaced under it.
type session struct {
	name    string
	open    bool   // its row was written (session_open)
	changes uint64 // the count of changes by others its last renewal reported
	rounds  int    // renewals so far (sessionLookEvery)
	// endsBy is when the session will have ended: a ttl after the reply
	// to its last renewal, or after its failure (a send of it that runs
	// later still extends it: session_close reads the end itself).
	endsBy time.Time
}

// token returns a fresh owner token for a lease of ttl: the name of the
// Client's session of ttl, then random digits.
func (r *renewals) token(ttl time.Duration) (string, error) {
	var random [tokenBytes - sessionChars/2]byte
	if _, err := rand.Read(random[:]); err != nil {
		return "", err
	}
	r.mu.Lock()
	s, err := r.sessionOf(ttl)
	r.mu.Unlock()
	if err != nil {
		return "", err
	}
	var t [2 * tokenBytes]byte // one allocation, the string's
	copy(t[:], s.name)
	hex.Encode(t[sessionChars:], random[:])
	return string(t[:]), nil
}

// sessionOf returns the session of ttl, made with a fresh name on first
// use. r.mu must be held.
func (r *renewals) sessionOf(ttl time.Duration) (*session, error) {
	if s := r.sessions[ttl]; s != nil {
		return s, nil
	}
	t, err := newToken()
	if err != nil {
		return nil, err
	}
	if r.sessions == nil {
		r.sessions = map[time.Duration]*session{}
	}
	s := &session{name: t[:sessionChars]}
	r.sessions[ttl] = s
	return s, nil
}

// sessionsOn reports whether c keeps sessions: the server can, and has
// not refused one.
func (r *renewals) sessionsOn(c *Client) bool {
	r.mu.Lock()
	off := r.sessOff
	r.mu.Unlock()
	return !off && c.eng.Sessions()
}

// attachable reports whether q's lease may be attached to the session
// named name: its token begins with name.
func (q *renewReq) attachable(name string) bool {
	return strings.HasPrefix(q.l.token, name)
}

// detachGen counts the refreshes of l's lease since its keep-alive
// started: each detaches the lease from its session (queries.sql,
// refresh), so a round applies a session's renewal only to a lease attached
// since the last of them.
func (l *Lock) detachGen() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ka == nil {
		return 0
	}
	return l.ka.detached
}

// detach counts a refresh of l's lease, before it is sent (detachGen).
func (l *Lock) detach() {
	l.mu.Lock()
	if l.ka != nil {
		l.ka.detached++
	}
	l.mu.Unlock()
}

// kept reports whether q's lease is attached still, as far as this Client
// knows: attached by a round, and not refreshed since (detached).
func (q *renewReq) kept() bool {
	return q.attached && q.l.detachGen() == q.gen
}

// sessionRound is the session's part of a round of ttl, after renew_many
// extended what it could of rest: it renews the session, which keeps the
// leases of kept, and attaches those of rest that renew_many extended and
// the session may keep.
func (r *renewals) sessionRound(c *Client, ttl time.Duration, kept, rest []*renewReq) {
	if !r.sessionsOn(c) {
		r.noSessions(c)
		r.leaveSession(kept)
		return
	}
	r.mu.Lock()
	s, err := r.sessionOf(ttl)
	r.mu.Unlock()
	if err != nil {
		r.leaveSession(kept)
		return
	}
	var fresh []*renewReq
	for _, q := range rest {
		if q.extended && q.attachable(s.name) {
			fresh = append(fresh, q)
		}
	}
	if len(kept) == 0 && len(fresh) == 0 {
		return
	}
	sent, changes, live, err := r.renewSessionAgain(c, ttl, s, kept)
	ctx, cancel := c.roundContext(ttl)
	defer cancel()
	switch {
	case err != nil && renewalCannotPass(err):
		r.sessionsOff(c, err)
		r.leaveSession(kept)
		return
	case err != nil:
		if !c.isClosed() {
			c.log.Warn("sqllock: a session's renewal failed until its leases' deadline; each lease's keep-alive ends its context", "session", s.name, "leases", len(kept), "err", err)
		}
		return
	case !live:
		// The session ended before this renewal ran (a pause, a server
		// that could not be reached): each of its keep-alives refreshes
		// on its own, which finds its lease lost; leases of this ttl
		// acquired from now on get a new session.
		if len(kept) > 0 {
			c.log.Warn("sqllock: a session ended before its renewal; its leases are lost", "session", s.name, "leases", len(kept))
		}
		r.mu.Lock()
		if r.sessions[ttl] == s {
			delete(r.sessions, ttl)
		}
		r.mu.Unlock()
		r.leaveSession(kept)
		return
	}
	s.rounds++
	if moved := changes != s.changes; len(kept) > 0 && (moved || s.rounds%sessionLookEvery == 0) {
		// Someone changed a lease of the session (queries.sql,
		// lock_delay), or it is time to look anyway: those no longer
		// attached refresh on their own.
		var ok bool
		if kept, ok = r.stillKept(ctx, c, kept); !ok && moved {
			// Which lease went is not known: none of them is renewed
			// this round, and the next round looks again. A lease's
			// keep-alive ends its context at its deadline if no round
			// can tell.
			r.attach(ctx, c, s, fresh)
			return
		}
	}
	s.changes = changes
	for _, q := range kept {
		if q.kept() {
			q.l.sharedRenewed(sent, q.asked, len(kept))
		} else {
			q.attached = false
		}
	}
	r.attach(ctx, c, s, fresh)
}

// leaveSession tells each keep-alive of qs that its lease is no longer kept
// by the session: it refreshes on its own, and joins the renewal again,
// unattached, after a success.
func (r *renewals) leaveSession(qs []*renewReq) {
	for _, q := range qs {
		q.attached = false
		tell(q.alone, nil)
	}
}

// renewSessionAgain renews s for ttl (renewSession), again after a pause
// while it fails in a way a retry may pass, until the earliest ValidUntil
// of the leases kept asked for when the round began: one statement for all
// of them, where a failed renew_many sends each lease to renew on its own.
// It returns when the renewal that answered was sent.
func (r *renewals) renewSessionAgain(c *Client, ttl time.Duration, s *session, kept []*renewReq) (sent time.Time, changes uint64, live bool, err error) {
	until := time.Now().Add(ttl)
	for _, q := range kept {
		until = minTime(until, q.asked)
	}
	for failures := 1; ; failures++ {
		ctx, cancel := c.roundContext(ttl)
		sent = time.Now()
		changes, live, err = r.renewSession(ctx, c, ttl, s)
		cancel()
		pause := renewBackoff(ttl, failures)
		if err == nil || renewalCannotPass(err) || !time.Now().Add(pause).Before(until) {
			return sent, changes, live, err
		}
		select {
		case <-c.closing:
			return sent, changes, live, err
		case <-time.After(pause):
		}
	}
}

// renewSession renews s for ttl, or opens it: it reports the count of
// changes by others, and whether the session lives.
func (r *renewals) renewSession(ctx context.Context, c *Client, ttl time.Duration, s *session) (changes uint64, live bool, err error) {
	h, us := sqltext.Hex(s.name), strconv.FormatInt(ttl.Microseconds(), 10)
	if !s.open {
		// The first session of the Client: the server's answers to the
		// session statements are proven first, once, on a name of the
		// proof's own (engine.ProveSessions).
		if err := c.eng.ProveSessions(ctx); err != nil {
			return 0, false, err
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return 0, false, ErrClosed
		}
		r.mu.Unlock()
		text := c.eng.SessionText("session_open", h, h, sqltext.Hex(c.holder), us)
		_, _, err := c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "session_open", Name: "session " + s.name, Text: text})
		s.endsBy = time.Now().Add(ttl)
		if n, ok := fault.Errno(err); ok && n == fault.DupEntry {
			err = nil // a send before, whose reply was lost, wrote it
		}
		r.mu.Lock()
		// Also when it failed: a send whose reply was lost may have
		// written the row, which Close then deletes.
		s.open = true
		r.mu.Unlock()
		if err != nil {
			return 0, false, err
		}
		return 0, true, nil
	}
	text := c.eng.SessionText("session_renew", us, h, h)
	res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "session_renew", Name: "session " + s.name, Text: text})
	s.endsBy = time.Now().Add(ttl)
	if err != nil {
		return 0, false, err
	}
	id, err := res.LastInsertId()
	if err != nil || id == 0 {
		return 0, false, err
	}
	return uint64(id - 1), true, nil
}

// stillKept returns those of kept whose lease is its owner's and attached
// still (session_found, in statements cut as renew_many's), and tells each
// of the others to refresh on its own. If a query fails it returns kept as
// it is, and false.
func (r *renewals) stillKept(ctx context.Context, c *Client, kept []*renewReq) ([]*renewReq, bool) {
	found := map[string]bool{}
	for _, st := range renewStatements(kept, r.limits(c)) {
		f, err := c.eng.SessionFound(ctx, litsOf(st.qs))
		if err != nil {
			return kept, false
		}
		for k := range f {
			found[k] = true
		}
	}
	still := kept[:0]
	for _, q := range kept {
		if q.allFound(found) {
			still = append(still, q)
			continue
		}
		q.attached = false
		tell(q.alone, nil)
	}
	return still, true
}

// attach attaches the leases of fresh to s, in statements cut as renew_many's
// are; a lease the statement did not attach stays with renew_many.
func (r *renewals) attach(ctx context.Context, c *Client, s *session, fresh []*renewReq) {
	for _, st := range renewStatements(fresh, r.limits(c)) {
		for _, q := range st.qs {
			q.gen = q.l.detachGen() // before the statement: a refresh after it detaches
		}
		lits := litsOf(st.qs)
		res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "session_attach",
			Name: strconv.Itoa(len(lits)) + " leases", Text: c.eng.SessionAttach(s.name, lits)})
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil {
			if renewalCannotPass(err) {
				r.sessionsOff(c, err)
			}
			return
		}
		var found map[string]bool // nil: every lease was attached
		if int(n) < len(lits) {
			if found, err = c.eng.SessionFound(ctx, lits); err != nil {
				found = map[string]bool{}
			}
		}
		for _, q := range st.qs {
			q.attached = found == nil || q.allFound(found)
		}
	}
}

// litsOf returns the lease rows of qs.
func litsOf(qs []*renewReq) []engine.RenewLit {
	var lits []engine.RenewLit
	for _, q := range qs {
		lits = append(lits, q.lits...)
	}
	return lits
}

// noSessions says once in the log that the Client keeps no session on its
// server (engine.Sessions), unless the server refused one, which
// sessionsOff said.
func (r *renewals) noSessions(c *Client) {
	proven := c.eng.Forms().Proven
	r.mu.Lock()
	said := r.sessSaid || r.sessOff || !proven
	r.sessSaid = r.sessSaid || proven
	r.mu.Unlock()
	if !said {
		c.log.Info(noSessionLine)
	}
}

// noSessionLine is noSessions' line.
const noSessionLine = "sqllock: this server keeps no session (TiDB, Vitess, or a node of Galera or Group Replication); each lease renews with the shared renewal of its own row"

// sessionsOff ends the Client's sessions for its life, after the server
// refused one with err: every lease renews with renew_many from then on.
// Said once, in the log.
func (r *renewals) sessionsOff(c *Client, err error) {
	if !r.setOnce(&r.sessOff) {
		c.log.Warn("sqllock: the server refused a session; each lease renews with the shared renewal of its own row from now on", "err", err)
	}
}

// lost records that l's keep-alive ended lost: if its lease may be attached
// to the session of its ttl (its token is the session's: it was attached,
// or may be by an attach whose answer was lost, or by the round under
// way), the next round of that ttl detaches it (detachLost). Its Lock may
// never be released: attached, its lease would last as long as the
// session, which the Client renews for its other leases, with no holder.
// A lease of a session that has ended has ended too, and one whose class
// has stopped ends with its session, which is no longer renewed.
func (r *renewals) lost(l *Lock) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cl, s := r.classes[l.ttl], r.sessions[l.ttl]
	if cl == nil || !cl.ticking || s == nil || r.sessOff || !strings.HasPrefix(l.token, s.name) {
		return
	}
	cl.lost = append(cl.lost, newRenewReq(l))
}

// detachLost detaches the leases of lost (queries.sql, session_detach), in
// statements cut as renew_many's, and returns those it did not: of a
// statement that failed and the ones after it, or all of them when the
// Client keeps no session. Until detached they last as long as the
// session. (A detach run twice changes nothing the first did not.)
func (r *renewals) detachLost(ctx context.Context, c *Client, lost []*renewReq) []*renewReq {
	if len(lost) == 0 || !r.sessionsOn(c) {
		return lost
	}
	sts := renewStatements(lost, r.limits(c))
	for i, st := range sts {
		lits := litsOf(st.qs)
		_, _, err := c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "session_detach",
			Name: strconv.Itoa(len(lits)) + " leases", Text: c.eng.SessionDetach(lits)})
		if err == nil {
			continue
		}
		if renewalCannotPass(err) {
			r.sessionsOff(c, err)
		}
		var left []*renewReq
		for _, st := range sts[i:] {
			left = append(left, st.qs...)
		}
		return left
	}
	return nil
}

// closeSession deletes s's row, if it was opened and has ended (rounds):
// all says whether it is deleted whether or not it has. s may be nil.
func (r *renewals) closeSession(ctx context.Context, c *Client, s *session, all bool) {
	if s == nil {
		return
	}
	r.mu.Lock()
	open := s.open
	r.mu.Unlock()
	if !open {
		return
	}
	h, flag := sqltext.Hex(s.name), "0"
	if all {
		flag = "1"
	}
	_, _, _ = c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "session_close", Name: "session " + s.name,
		Text: c.eng.SessionText("session_close", h, h, flag)})
}
