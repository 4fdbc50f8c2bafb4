package sqllock

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
)

// The Client's shared renewal. The leases its keep-alives hold for one ttl
// are renewed together, in rounds every ttl/3 at instants counted from the
// process's start (renewDelay), each round a few statements of up to tens
// of thousands of leases (queries.sql, renew_many; renewal_sizing.go;
// fitRows), not one statement a lease. Each lease is still extended only
// while it is its owner's and live, so every rule of a Lock's own refresh
// holds. A round takes each success as a Refresh's, without waking the
// keep-alive's goroutine: it moves the goroutine's deadline timer
// (keepalive.go, setDeadline). The statement counts the
// leases it extended; when it extended fewer than it carried, a query of
// the leases it carried tells which (renew_found); each keep-alive whose
// lease it did not extend, and every one when it failed, is told, leaves
// the shared renewal and refreshes on its own, which tells whether the
// lease was lost, and tells its holder alone; after a success on its own
// it joins again. A Lock's deadline does not depend on the shared
// renewal: a keep-alive whose renewals do not come back ends its contexts
// a safety margin before its own ValidUntil.

// ownParallel bounds a Client's keep-alives' renewals on their own under
// way at once (own): a failed statement tells its thousands of leases to
// renew on their own at once, a connection each, unbounded, past the
// server's max_connections (1040) for every user of it.
const ownParallel = 16

// renewals is a Client's shared renewal.
type renewals struct {
	mu  sync.Mutex
	off bool // the server refused renew_many: each lease renews on its own
	// most is how many leases a statement carries now, within the
	// server's bound (engine.RenewLimits): from the bound every server
	// takes (0), as many as a statement answers in a quarter of its time,
	// at most doubling a round (fit); halved when such a statement failed.
	most    int
	shrunk  bool // said in the log
	classes map[time.Duration]*renewClass
	owning  chan struct{} // the places of renewals on their own (ownParallel)
	// sessions are the Client's sessions, by ttl; sessOff: the server
	// refused one, and every lease renews with renew_many (session.go).
	sessions map[time.Duration]*session
	sessOff  bool
	sessSaid bool // noSessions said so
	// closed: Close deletes the sessions' rows, and no session opens from
	// then on; busy counts the rounds under way, which Close waits for.
	closed bool
	busy   int
}

// own runs refresh, a keep-alive's renewal on its own, in one of the
// Client's ownParallel places; if none frees before ctx ends, it fails as
// a renewal that timed out, tried again after a pause.
func (r *renewals) own(ctx context.Context, refresh func() error) error {
	r.mu.Lock()
	if r.owning == nil {
		r.owning = make(chan struct{}, ownParallel)
	}
	owning := r.owning
	r.mu.Unlock()
	select {
	case owning <- struct{}{}:
	case <-ctx.Done():
		return errorf("a renewal on its own found none of the Client's %d places free: %w", ownParallel, ctx.Err())
	}
	defer func() { <-owning }()
	return refresh()
}

// A renewClass is the keep-alives of one ttl that renew together.
type renewClass struct {
	ttl     time.Duration
	members map[*Lock]*renewReq
	ticking bool // a goroutine runs its rounds
	// lost are the members whose keep-alives ended lost while their
	// leases may have been attached: the next round detaches them
	// (session.go, detachLost).
	lost []*renewReq
}

// A renewReq is one keep-alive in the shared renewal, made when it joins
// and used by every round until it leaves (a round and the next do not
// overlap).
type renewReq struct {
	l     *Lock
	lits  []engine.RenewLit // its lease rows (lockKind.rows), rendered once
	alone chan error        // where it is told to renew on its own
	asked time.Time         // the Lock's ValidUntil when the round began
	// extended: this round's renew_many extended the lease. attached: a
	// round attached it to its session, when the Lock's detachGen was gen
	// (session.go).
	extended, attached bool
	gen                uint64
}

// renewDelay is how long until a keep-alive that renews every interval
// renews next: at the first instant from now on that is a whole number of
// intervals after monoBase, the same for every keep-alive of that
// interval, so that their renewals share statements. It is never more than
// interval, so renewals stay at most ttl/3 apart, as the lock-delay's
// bound counts on (admin.go); a lease acquired just before such an instant
// is renewed at once.
func renewDelay(interval time.Duration) time.Duration {
	now := time.Since(monoBase)
	return (now/interval+1)*interval - now
}

func (r *renewals) isOff() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.off
}

// join adds l's keep-alive to the shared renewal of its ttl and returns
// the channel on which it is told to renew on its own (nil: the
// statement extended fewer leases than it carried; else its error).
func (r *renewals) join(c *Client, l *Lock) <-chan error {
	q := newRenewReq(l)
	q.alone = make(chan error, 1)
	r.mu.Lock()
	if r.classes == nil {
		r.classes = map[time.Duration]*renewClass{}
	}
	cl := r.classes[l.ttl]
	if cl == nil {
		cl = &renewClass{ttl: l.ttl, members: map[*Lock]*renewReq{}}
		r.classes[l.ttl] = cl
	}
	cl.members[l] = q
	start := !cl.ticking
	cl.ticking = true
	r.mu.Unlock()
	if start {
		go r.rounds(c, cl)
	}
	return q.alone
}

// newRenewReq returns the renewReq of l's lease rows.
func newRenewReq(l *Lock) *renewReq {
	q := &renewReq{l: l}
	for _, n := range l.kind.rows(l) {
		q.lits = append(q.lits, engine.NewRenewLit(n, l.token))
	}
	return q
}

// leave takes l's keep-alive out of the shared renewal.
func (r *renewals) leave(l *Lock) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cl := r.classes[l.ttl]; cl != nil {
		delete(cl.members, l)
	}
}

// rounds runs the rounds of cl until the Client closes, or it has no
// member and its session has ended: then it deletes the session's row.
// Not before, for the row's end is that of every lease still attached to
// it, which may be a holder's (renewing on its own, which detaches it)
// or have a ValidUntil still to come (lost and not yet detached).
func (r *renewals) rounds(c *Client, cl *renewClass) {
	interval := cl.ttl / 3
	t := time.NewTimer(renewDelay(interval))
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.closing:
			r.mu.Lock()
			cl.ticking = false
			r.mu.Unlock()
			return
		}
		r.mu.Lock()
		due := make([]*renewReq, 0, len(cl.members))
		for _, q := range cl.members {
			due = append(due, q)
		}
		if len(due) == 0 {
			s := r.sessions[cl.ttl]
			if s != nil && s.open && time.Now().Before(s.endsBy) {
				// The class waits, idle, for its session to end. A
				// keep-alive that joins meanwhile renews it again.
				r.mu.Unlock()
				t.Reset(renewDelay(interval))
				continue
			}
			cl.ticking, cl.lost = false, nil
			delete(r.sessions, cl.ttl) // leases acquired from now on get a new one
			r.mu.Unlock()
			ctx, cancel := c.roundContext(time.Second)
			r.closeSession(ctx, c, s, false)
			cancel()
			return
		}
		lost := cl.lost
		cl.lost = nil
		r.busy++
		r.mu.Unlock()
		began := time.Now()
		r.round(c, cl.ttl, due)
		// After the round, whose renewals have deadlines: a lease that
		// ended lost is its holder's no more, whenever it is detached.
		// Those not detached are tried again by the next round.
		ctx, cancel := c.roundContext(cl.ttl)
		left := r.detachLost(ctx, c, lost)
		cancel()
		on := r.sessionsOn(c)
		r.mu.Lock()
		if on {
			cl.lost = append(cl.lost, left...)
		}
		r.busy--
		r.mu.Unlock()
		next := renewDelay(interval)
		if time.Since(began) >= interval {
			// The round ran past the next instant (many leases on a busy
			// machine): the next goes at once, not an instant later.
			next = 0
		}
		t.Reset(next)
	}
}

// closeSessions deletes the row of each session the Client opened, when it
// closes, after its leases were released. A round under way opens no
// session from then on, and is waited for (within ctx): a session it was
// opening is deleted too. The leases lost and not detached yet are
// detached first, to end when the session would have; if that fails, the
// row is deleted only if the session has ended.
func (r *renewals) closeSessions(ctx context.Context, c *Client) {
	r.mu.Lock()
	r.closed = true
	for r.busy > 0 && ctx.Err() == nil {
		r.mu.Unlock()
		time.Sleep(time.Millisecond)
		r.mu.Lock()
	}
	type closing struct {
		s    *session
		ttl  time.Duration
		lost []*renewReq
	}
	var open []closing
	for ttl, s := range r.sessions {
		if s.open {
			cs := closing{s: s, ttl: ttl}
			if cl := r.classes[ttl]; cl != nil {
				cs.lost, cl.lost = cl.lost, nil
			}
			open = append(open, cs)
		}
		delete(r.sessions, ttl)
	}
	r.mu.Unlock()
	for _, cs := range open {
		dctx, cancel := context.WithTimeout(ctx, renewTimeout(cs.ttl))
		left := r.detachLost(dctx, c, cs.lost)
		cancel()
		r.closeSession(ctx, c, cs.s, len(left) == 0)
	}
}

// round renews the leases due of c, in statements cut and sized as
// renewal_sizing.go says.
func (r *renewals) round(c *Client, ttl time.Duration, due []*renewReq) {
	if r.isOff() {
		// The server refused the statement: every keep-alive still in
		// the shared renewal renews on its own from now on.
		for _, q := range due {
			tell(q.alone, nil)
		}
		return
	}
	live := due[:0]
	for _, q := range due {
		var ok bool
		if q.asked, ok = q.l.sharedDue(); ok {
			live = append(live, q)
		}
	}
	// The leases that end soonest go first: a round that runs long (many
	// thousand leases on a busy server) renews last those with the most
	// time left.
	slices.SortFunc(live, func(a, b *renewReq) int { return a.asked.Compare(b.asked) })
	// Those attached to the session are kept by its renewal (session.go);
	// the rest go to renew_many first.
	var kept, rest []*renewReq
	for _, q := range live {
		q.extended = false
		if q.kept() {
			kept = append(kept, q)
		} else {
			q.attached = false
			rest = append(rest, q)
		}
	}
	r.fit(c, ttl, r.sendAll(c, ttl, renewStatements(rest, r.limits(c))))
	r.sessionRound(c, ttl, kept, rest)
}

// sendAll sends the statements stmts of a round, roundParallel at a time,
// and returns their answers.
func (r *renewals) sendAll(c *Client, ttl time.Duration, stmts []renewStmt) []renewAnswer {
	var wg sync.WaitGroup
	running := make(chan struct{}, roundParallel(stmts))
	answers := make([]renewAnswer, len(stmts))
	for i, s := range stmts {
		running <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = r.send(c, ttl, s)
			<-running
		}()
	}
	wg.Wait()
	return answers
}

// sharedDue returns l's ValidUntil, for a round, and whether the round
// carries it: not once its keep-alive has ended or a release has started,
// so that a round racing a Release does not carry the row it deletes, nor
// once its deadline has passed (after a pause, before its goroutine has
// run): a lease past its deadline is not renewed for work that may have
// been told it is lost.
func (l *Lock) sharedDue() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released || l.endCause != nil || l.ka == nil || l.ka.cause != nil ||
		!time.Now().Before(l.validUntil.Add(-l.ka.margin)) {
		return time.Time{}, false
	}
	return l.validUntil, true
}

// tell sends err to a keep-alive told to renew on its own, unless it has
// been told already.
func tell(alone chan error, err error) {
	select {
	case alone <- err:
	default:
	}
}

// send sends one shared renewal for ttl of the leases qs. Each
// lease it extended takes it as a Refresh's success: all of them when it
// extended as many as it carried, else those renew_found finds. Each of
// the others, and all when it failed, is told to renew on its own.
func (r *renewals) send(c *Client, ttl time.Duration, st renewStmt) renewAnswer {
	qs := st.qs
	lits := make([]engine.RenewLit, 0, st.size.rows)
	until := qs[0].asked
	for _, q := range qs {
		lits = append(lits, q.lits...)
		until = minTime(until, q.asked)
	}
	ctx, cancel := c.roundContext(ttl)
	defer cancel()
	sent := time.Now()
	res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "renew_many",
		Name: strconv.Itoa(len(lits)) + " leases", Text: c.eng.RenewMany(ttl, lits), Until: until})
	n := 0
	if err == nil {
		var a int64
		a, err = res.RowsAffected()
		n = int(a)
	}
	var answer renewAnswer
	if err == nil {
		answer = renewAnswer{len(lits), time.Since(sent)}
	}
	if err != nil && smallLimits.over(st.size) {
		// A statement past the bounds every server takes failed: too
		// slow for its time on a busy server, say, or over the server's
		// max_allowed_packet. Its leases go again now in statements
		// within those bounds, and later ones carry half as many.
		r.shrink(c, len(lits), err)
		r.sendAll(c, ttl, renewStatements(qs, smallLimits))
		return renewAnswer{}
	}
	switch {
	case err != nil && renewalCannotPass(err):
		r.turnOff(c, err)
	case err != nil && !c.isClosed():
		// One line for the statement, not one for each of its leases.
		c.log.Warn("sqllock: a shared renewal of leases failed; each retries on its own", "leases", len(lits), "err", err)
	}
	var found map[string]bool // nil: every lease was extended
	if err == nil && n < len(lits) {
		// Some lease was not: which, the leases the statement carried
		// that are their owner's and live now tell (renew_found). If the
		// query fails, each renews on its own.
		if found, err = c.eng.RenewFound(ctx, lits); err != nil {
			err = nil
			found = map[string]bool{}
		}
	}
	for _, q := range qs {
		switch {
		case err != nil:
			tell(q.alone, err)
		case found == nil || q.allFound(found):
			q.extended = true
			q.l.sharedRenewed(sent, q.asked, n)
		default:
			tell(q.alone, nil)
		}
	}
	return answer
}

// roundContext returns the context of a statement of a round of ttl: it
// ends after renewTimeout, or when the Client closes.
func (c *Client) roundContext(ttl time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), renewTimeout(ttl))
	go func() {
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// allFound reports whether every lease row of q is in found (renew_found's
// answer).
func (q *renewReq) allFound(found map[string]bool) bool {
	for _, l := range q.lits {
		if !found[l.Key] {
			return false
		}
	}
	return true
}

// sharedRenewed takes a shared renewal sent at sent, when l was valid
// until asked, that extended l's lease among n: as Refresh takes its
// success, but without waking the keep-alive's goroutine, whose deadline
// timer it moves. Nothing changes once the keep-alive has ended or a
// release has started.
func (l *Lock) sharedRenewed(sent, asked time.Time, n int) {
	l.mu.Lock()
	ka := l.ka
	if l.released || l.endCause != nil || ka == nil || ka.cause != nil {
		l.mu.Unlock()
		return
	}
	if t := sent.Add(l.ttl); t.After(l.validUntil) {
		l.validUntil = t
		ka.setDeadline(t)
	}
	ka.lastErr = nil
	l.mu.Unlock()
	l.c.held.readd(l) // after l.mu: the registry's lock comes first
	l.refreshed(sent, asked, l.ttl, false, nil, n)
}

// turnOff ends the shared renewal for the Client's life, after the server
// refused its statement with err: each lease renews on its own from then
// on. Said once, in the log.
func (r *renewals) turnOff(c *Client, err error) {
	if !r.setOnce(&r.off) {
		c.log.Warn("sqllock: the server refused the shared renewal of leases; each lease renews on its own from now on", "err", err)
	}
}

// setOnce sets the flag of r that flag points to, under r.mu, and reports
// whether it was set already.
func (r *renewals) setOnce(flag *bool) (was bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	was, *flag = *flag, true
	return was
}
