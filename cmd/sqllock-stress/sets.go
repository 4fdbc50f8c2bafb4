package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sqllock/sqllock"
)

// The -set mode: each goroutine takes -set names at once, chosen at random
// among the -names, with TryAcquireSet, and runs one critical section over
// all of them. Each name of the set is reported as a section of its own,
// with its own fence, clock reads and fenced writes, so the checker holds
// every name of every set to what it holds a single name to: never two
// live holders, a fence issued once, fences in acquisition order, and a
// resource that accepted only the writes of the name's current fence.

// contendSet is contend for -set: one goroutine, until stop.
func (w *worker) contendSet(ctx context.Context, g int) {
	ttl := w.cfg.ttl
	cur := w.cfg.child % len(w.nodes)
	all := make([]string, w.cfg.names)
	for i := range all {
		all[i] = nameOf(i)
	}
	for time.Now().Before(w.stop) {
		n := w.nodes[cur]
		rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		set := slices.Clone(all[:w.cfg.set])
		w.count(func(r *childReport) { r.Attempts++ })
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		call := stamp()
		l, err := n.c.TryAcquireSet(actx, set, ttl)
		cancel()
		ret := stamp()
		for i, name := range set {
			op := histOp{Kind: "acquire", Name: name, Goroutine: g, Result: opResult(err, "refused"), Call: call, Return: ret,
				TTL: int64(ttl), Set: len(set), KeepAlive: w.cfg.keepAlive}
			if err == nil {
				op.Name, op.Fence = l.Names()[i], l.Fences()[i]
			}
			w.hist(op)
		}
		switch {
		case errors.Is(err, sqllock.ErrNotAcquired):
			w.count(func(r *childReport) { r.Refused++ })
			time.Sleep(rand.N(ttl/20 + time.Millisecond))
			continue
		case err != nil:
			w.fail("acquire", err, "p%d/g%d: TryAcquireSet(%q): %v", w.cfg.child, g, set, err)
			if movesOn(err) {
				cur = (cur + 1) % len(w.nodes)
			}
			time.Sleep(ttl / 10)
			continue
		}
		recs, op, err := w.sectionSet(ctx, n, g, l)
		if err != nil {
			for i := range recs {
				recs[i].Err = op + ": " + errClass(err)
			}
			w.fail(op, err, "p%d/g%d: %q: %s: %v", w.cfg.child, g, l.Names(), op, err)
			if movesOn(err) {
				cur = (cur + 1) % len(w.nodes)
			}
		}
		for _, rec := range recs {
			w.emit(rec)
		}
	}
}

// sectionSet is section for a Lock on a set: the clock and the writes once
// per name, the refresh and the release once for the set.
func (w *worker) sectionSet(ctx context.Context, n *node, g int, l *sqllock.Lock) (recs []record, op string, err error) {
	names, fences := l.Names(), l.Fences()
	stalled := rand.Float64() < w.cfg.stallFraction
	recs = make([]record, len(names))
	for i, name := range names {
		recs[i] = record{Proc: w.cfg.child, Goroutine: g, Name: name, Fence: fences[i], Stalled: stalled,
			Belief: l.ValidUntil().UnixMicro(), Acquired: time.Now().UnixMicro()}
	}
	defer func() {
		if err != nil {
			for i := range recs {
				recs[i].Released = time.Now().UnixMicro()
			}
			w.release(ctx, g, l)
		}
	}()
	clock := func(start bool) error {
		for i, name := range names {
			now, expiry, err := n.serverClock(ctx, name, l.Token())
			received := time.Now()
			if err != nil {
				return err
			}
			r := &recs[i]
			if start {
				r.Start = now
				r.Expiry = now + l.ValidUntil().Sub(received).Microseconds()
			} else {
				r.End = now
			}
			if expiry.Valid {
				if start {
					r.Expiry = expiry.Int64
				} else {
					r.Expiry = max(r.Expiry, expiry.Int64)
				}
			}
		}
		return nil
	}
	writes := func() error {
		for i, name := range names {
			call := stamp()
			ok, conflicts, err := n.fencedWrite(ctx, name, fences[i])
			w.histWrite(g, name, fences[i], len(names), call, ok, err)
			r := &recs[i]
			r.Conflicts += conflicts
			switch {
			case ok:
				r.Accepted++
			case err == nil:
				r.Rejected++
			case conflict(err):
			default:
				r.Maybe++
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := clock(true); err != nil {
		return recs, "clock", err
	}
	if err := writes(); err != nil {
		return recs, "write", err
	}
	var kctx context.Context
	switch {
	case w.cfg.keepAlive:
		// As section's: the keep-alive renews the set through the sleep,
		// a stalled holder's too (attached to the Client's session, where
		// the server keeps one); only a fault can make it lose the set.
		kctx = l.KeepAlive(ctx)
		if stalled {
			time.Sleep(w.cfg.ttl + w.cfg.ttl/2)
		} else {
			time.Sleep(rand.N(w.cfg.ttl/2 + 1))
		}
	case stalled:
		time.Sleep(w.cfg.ttl + w.cfg.ttl/2) // past the lease, without refreshing
	default:
		time.Sleep(rand.N(w.cfg.ttl/4 + 1))
		w.count(func(r *childReport) { r.Refresh++ })
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		call := stamp()
		err := l.Refresh(rctx, w.cfg.ttl)
		cancel()
		ret := stamp()
		for i, name := range names {
			w.hist(histOp{Kind: "refresh", Name: name, Goroutine: g, Fence: fences[i], Result: opResult(err, "notheld"),
				Call: call, Return: ret, TTL: int64(w.cfg.ttl), Set: len(names)})
		}
		if err != nil && !errors.Is(err, sqllock.ErrNotHeld) {
			return recs, "refresh", err
		}
		if err == nil {
			for i := range recs {
				recs[i].Belief = max(recs[i].Belief, l.ValidUntil().UnixMicro())
			}
		}
	}
	if err := writes(); err != nil {
		return recs, "write", err
	}
	if err := clock(false); err != nil {
		return recs, "clock", err
	}
	if kctx != nil {
		// A keep-alive that has not reported a loss by now claims every
		// name of the set: the belief check holds it to that.
		lost := kctx.Err() != nil
		for i := range recs {
			if recs[i].KeepAliveLost = lost; !lost {
				recs[i].Belief = max(recs[i].Belief, time.Now().UnixMicro())
			}
		}
	}
	switch err := w.release(ctx, g, l); {
	case errors.Is(err, sqllock.ErrNotHeld):
		for i := range recs {
			recs[i].TakenOver = true
		}
	case err != nil:
		return recs, "release", err
	}
	return recs, "", nil
}
