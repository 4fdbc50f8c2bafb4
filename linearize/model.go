package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/anishathalye/porcupine"
)

// maxSlots is the most slots of a semaphore the model holds.
const maxSlots = 16

// A state is one name's state in the model: the highest fence issued, the
// latest lease (of a lock, or of each slot of a semaphore), and the
// register. It is a value: Step returns new states and never changes one.
type state struct {
	issued uint64 // the highest fence an acquire returned
	// leases[0] is a lock's latest lease; leases[1] to leases[n], the
	// latest lease of each slot of a semaphore of n.
	leases [maxSlots + 1]lease
	reg    uint64 // the register's fence: the last write's
	writes int64  // the register's count of writes
}

// A lease is the latest lease of a lock or of a slot.
type lease struct {
	holder   uint64 // its fence (0: none yet)
	released bool   // it was released, or may have been
	// It lasted at least until expMin and at most until expMax, in ns on
	// the history's clock (math.MaxInt64: no bound known, as under a
	// keep-alive, whose renewals the history does not show).
	expMin, expMax int64
}

func (s state) String() string {
	var leases []string
	for i, l := range s.leases {
		var d string
		switch {
		case l.holder == 0:
			continue
		case l.released:
			d = fmt.Sprintf("lease %d released", l.holder)
		case l.expMax == math.MaxInt64:
			d = fmt.Sprintf("lease %d until at least %d", l.holder, l.expMin)
		default:
			d = fmt.Sprintf("lease %d until %d..%d", l.holder, l.expMin, l.expMax)
		}
		if i > 0 {
			d = fmt.Sprintf("slot %d: %s", i, d)
		}
		leases = append(leases, d)
	}
	if len(leases) == 0 {
		leases = []string{"no lease"}
	}
	return fmt.Sprintf("issued %d, %s; register fence %d, %d writes", s.issued, strings.Join(leases, ", "), s.reg, s.writes)
}

// The lease rules compare the times of operations with a lease's bounds:
// an operation ran on the server at some time between its call and its
// return, and a lease taken or renewed at t lasts until t + ttl. slack
// widens each comparison for the clocks' disagreement, in the direction
// that accepts.

// live reports whether o, of the latest lease's holder, may have run while
// that lease was live and not released.
func (s state) live(o op, slack int64) bool {
	l := s.leases[o.Slot]
	return l.holder == o.Fence && !l.released && o.Call-slack < l.expMax
}

// lost reports whether o may have found its lease gone: taken over,
// released, or expired by the time it ran.
func (s state) lost(o op, slack int64) bool {
	l := s.leases[o.Slot]
	return l.holder != o.Fence || l.released || o.Return+slack >= l.expMin
}

// step is the model's step: the states o may lead to from s, none when o
// cannot have happened in s.
func step(s state, o op, slack int64) []state {
	if o.Kind != "acquire" && o.Kind != "read" && o.Fence > s.issued {
		return nil // a fence no acquire issued
	}
	l := &s.leases[o.Slot] // s is a copy: changing l changes only the new state
	switch o.Kind + " " + o.Result {
	case "acquire ok":
		// Fences strictly grow in the order acquisitions take effect (a
		// semaphore's across its slots), and a lease is taken only once
		// the latest one (of its slot) was released or had expired; a
		// semaphore of n has slots 1 to n.
		// The acquire with the next lower fence comes first (orderAcquires).
		if o.Fence <= s.issued || s.issued < o.Prev || l.holder != 0 && !l.released && o.Return+slack < l.expMin || o.Slot > o.Slots {
			return nil
		}
		s.issued = o.Fence
		*l = lease{holder: o.Fence, expMin: o.Call + o.TTL, expMax: o.Return + o.TTL}
		if o.KeepAlive {
			l.expMax = math.MaxInt64
		}
		return []state{s}
	case "refresh ok":
		// Only a live lease of the caller's is extended.
		if !s.live(o, slack) {
			return nil
		}
		l.expMin = max(l.expMin, o.Call+o.TTL)
		if l.expMax != math.MaxInt64 {
			l.expMax = max(l.expMax, o.Return+o.TTL)
		}
		return []state{s}
	case "refresh notheld", "release notheld", "cwrite refused":
		if !s.lost(o, slack) {
			return nil
		}
		return []state{s}
	case "refresh unknown":
		// It may have extended the lease, by any time.
		if l.holder == o.Fence && !l.released {
			l.expMax = math.MaxInt64
		}
		return []state{s}
	case "release ok":
		// The lease was still the caller's: nobody took it over.
		if l.holder != o.Fence {
			return nil
		}
		l.released = true
		return []state{s}
	case "release unknown":
		// Released or not; either way the holder does no more, and a
		// release only lets others in sooner.
		if l.holder == o.Fence {
			l.released = true
		}
		return []state{s}
	case "write ok":
		// The register takes a write whose fence is at least its own.
		if s.reg > o.Fence {
			return nil
		}
		s.reg = o.Fence
		s.writes++
		return []state{s}
	case "write rejected":
		if s.reg <= o.Fence {
			return nil
		}
		return []state{s}
	case "write unknown":
		if s.reg > o.Fence {
			return []state{s}
		}
		w := s
		w.reg = o.Fence
		w.writes++
		return []state{s, w}
	case "cwrite ok":
		// A write after Lock.Check in its transaction commits only while
		// the writer's lease is live; the register has no guard of its own.
		if !s.live(o, slack) {
			return nil
		}
		s.reg = o.Fence
		s.writes++
		return []state{s}
	case "cwrite unknown":
		if !s.live(o, slack) {
			return []state{s}
		}
		w := s
		w.reg = o.Fence
		w.writes++
		return []state{s, w}
	case "read ok":
		if s.reg != o.Fence || s.writes != o.Writes {
			return nil
		}
		return []state{s}
	}
	return nil
}

// newModel is the model of one name (the history is partitioned by name):
// its lock and its register, with slack ns for the clocks.
func newModel(slack int64) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
			byName := map[string]int{}
			var parts [][]porcupine.Operation
			for _, o := range ops {
				name := o.Input.(op).Name
				i, ok := byName[name]
				if !ok {
					i = len(parts)
					byName[name] = i
					parts = append(parts, nil)
				}
				parts[i] = append(parts[i], o)
			}
			return parts
		},
		Init: func() []interface{} { return []interface{}{state{}} },
		Step: func(s, in, _ interface{}) []interface{} {
			var out []interface{}
			for _, n := range step(s.(state), in.(op), slack) {
				out = append(out, n)
			}
			return out
		},
		Hash: func(s interface{}) uint64 {
			st := s.(state)
			h := st.issued*0x9e3779b97f4a7c15 ^ st.reg*0x94d049bb133111eb ^ uint64(st.writes)*41
			for i, l := range st.leases {
				if l.holder == 0 {
					continue
				}
				k := uint64(i + 1)
				h ^= (l.holder*0xbf58476d1ce4e5b9 ^ uint64(l.expMin)*31 ^ uint64(l.expMax)*37) * k
				if l.released {
					h ^= k << 56
				}
			}
			return h
		},
		DescribeOperation: func(in, _ interface{}) string { return in.(op).String() },
		DescribeState:     func(s interface{}) string { return s.(state).String() },
	}
	return nm.ToModel()
}
