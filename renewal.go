package sqllock

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
)

// The Client's shared renewal. The leases its keep-alives hold for one ttl
// are renewed together: each keep-alive renews at instants shared by all
// of that ttl (renewDelay), and the renewals due at once go to the server
// as a few statements of up to maxRenewRows leases each (queries.sql,
// renew_many), not one statement a lease. Each lease is still extended
// only while it is its owner's and live, so every rule of a Lock's own
// refresh holds. The statement counts the leases it extended: when it
// extended all, each keep-alive takes its answer as a refresh's; when
// fewer, each of its leases is refreshed on its own, which tells which was
// lost, and tells its holder alone. Retries after a failed renewal go on
// their own too, as before. A Lock's deadline does not depend on the
// shared renewal: a keep-alive whose renewals do not come back ends its
// contexts a safety margin before its own ValidUntil.

const (
	// maxRenewRows and maxRenewBytes bound one shared renewal: MySQL
	// plans an IN list of a few thousand keys as reads by key within its
	// default range_optimizer_max_mem_size (8 MiB), and a statement of
	// 1 MiB stays within every server's default max_allowed_packet.
	maxRenewRows  = 4096
	maxRenewBytes = 1 << 20
	// renewGather is how long the first keep-alive due waits for the
	// others due at the same instant before the statement is sent.
	renewGather = 2 * time.Millisecond
	// renewParallel is how many statements of one round run at once.
	renewParallel = 4
)

// renewals is a Client's shared renewal.
type renewals struct {
	mu      sync.Mutex
	off     bool // the server refused renew_many: each lease renews on its own
	classes map[time.Duration]*renewClass
}

// A renewClass is the renewals due of the keep-alives of one ttl.
type renewClass struct {
	pending  []*renewReq
	flushing bool // a goroutine sends pending, and whatever joins it
}

// A renewReq is one keep-alive's renewal, waiting for its statement.
type renewReq struct {
	l      *Lock
	rows   []string
	until  time.Time // the Lock's ValidUntil when it joined
	answer chan renewAnswer
}

// A renewAnswer is what the statement that carried a renewal answered.
type renewAnswer struct {
	sent time.Time
	n    int  // leases the statement extended
	all  bool // it extended every lease it carried
	err  error
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

// join adds l's renewal to those due for its ttl and returns the channel
// its answer comes on.
func (r *renewals) join(c *Client, l *Lock, until time.Time) <-chan renewAnswer {
	q := &renewReq{l: l, rows: l.kind.rows(l), until: until, answer: make(chan renewAnswer, 1)}
	r.mu.Lock()
	if r.classes == nil {
		r.classes = map[time.Duration]*renewClass{}
	}
	cl := r.classes[l.ttl]
	if cl == nil {
		cl = &renewClass{}
		r.classes[l.ttl] = cl
	}
	cl.pending = append(cl.pending, q)
	start := !cl.flushing
	cl.flushing = true
	r.mu.Unlock()
	if start {
		go c.flushRenewals(l.ttl, cl)
	}
	return q.answer
}

// flushRenewals sends the renewals due for ttl, and those that join while
// it sends, until none is left.
func (c *Client) flushRenewals(ttl time.Duration, cl *renewClass) {
	r := &c.renewals
	time.Sleep(renewGather)
	for {
		r.mu.Lock()
		due := cl.pending
		cl.pending = nil
		if len(due) == 0 {
			cl.flushing = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		var wg sync.WaitGroup
		running := make(chan struct{}, renewParallel)
		for _, s := range renewStatements(due) {
			running <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.sendRenewal(ttl, s)
				<-running
			}()
		}
		wg.Wait()
	}
}

// renewStatements splits the renewals due into statements within
// maxRenewRows and maxRenewBytes, each name once in a statement. A
// renewal that shares a name with one before it (a Lock that lost the
// name, not yet told, and another that took it) is answered at once as
// not extended, so that it refreshes on its own.
func renewStatements(due []*renewReq) [][]*renewReq {
	var (
		out   [][]*renewReq
		cur   []*renewReq
		rows  int
		bytes int
		seen  = map[string]bool{}
	)
	for _, q := range due {
		size := 0
		dup := false
		for _, n := range q.rows {
			size += 4*len(n) + 74 // the name's literal, and the token's and name's
			dup = dup || seen[n]
		}
		if dup {
			q.answer <- renewAnswer{sent: time.Now()}
			continue
		}
		if len(cur) > 0 && (rows+len(q.rows) > maxRenewRows || bytes+size > maxRenewBytes) {
			out = append(out, cur)
			cur, rows, bytes = nil, 0, 0
		}
		cur = append(cur, q)
		rows += len(q.rows)
		bytes += size
		for _, n := range q.rows {
			seen[n] = true
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// sendRenewal sends one shared renewal for ttl of the renewals due, qs,
// and answers each of them.
func (c *Client) sendRenewal(ttl time.Duration, qs []*renewReq) {
	var rows, owners []string
	until := qs[0].until
	for _, q := range qs {
		for _, n := range q.rows {
			rows = append(rows, n)
			owners = append(owners, q.l.token)
		}
		until = minTime(until, q.until)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ttl/4)
	defer cancel()
	go func() {
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	sent := time.Now()
	res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: engine.Text, Label: "renew_many",
		Name: strconv.Itoa(len(rows)) + " leases", Text: c.eng.RenewMany(ttl, rows, owners), Until: until})
	n := 0
	if err == nil {
		var a int64
		a, err = res.RowsAffected()
		n = int(a)
	}
	if err != nil && renewalCannotPass(err) {
		c.renewals.turnOff(c, err)
	}
	a := renewAnswer{sent: sent, n: n, all: err == nil && n == len(rows), err: err}
	for _, q := range qs {
		q.answer <- a
	}
}

// turnOff ends the shared renewal for the Client's life, after the server
// refused its statement with err: each lease renews on its own from then
// on. Said once, in the log.
func (r *renewals) turnOff(c *Client, err error) {
	r.mu.Lock()
	was := r.off
	r.off = true
	r.mu.Unlock()
	if !was {
		c.log.Warn("sqllock: the server refused the shared renewal of leases; each lease renews on its own from now on", "err", err)
	}
}
