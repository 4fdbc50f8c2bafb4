package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/anishathalye/porcupine"
)

// An op is one line of a history file, as sqllock-stress -history writes
// it (doc.go describes each field).
type op struct {
	Kind      string `json:"k"`
	Name      string `json:"n"`
	Proc      int    `json:"p"`
	Goroutine int    `json:"g"`
	Fence     uint64 `json:"f"`
	Result    string `json:"r"`
	Call      int64  `json:"c"`
	Return    int64  `json:"t"`
	TTL       int64  `json:"ttl"`
	KeepAlive bool   `json:"ka"`
	Set       int    `json:"set"`
	Writes    int64  `json:"w"`
	// Slot and Slots: a semaphore's operation, on slot Slot (1 to Slots)
	// of a semaphore of Slots.
	Slot  int `json:"slot"`
	Slots int `json:"slots"`
	// Prev, of an acquire that succeeded: the highest fence below its own
	// that another recorded acquire of the name got (0: none), set by
	// readHistory (orderAcquires).
	Prev uint64 `json:"-"`
}

func (o op) String() string {
	who := fmt.Sprintf("p%d/g%d", o.Proc, o.Goroutine)
	if o.Proc < 0 {
		who = "parent"
	}
	switch o.Kind {
	case "read":
		return fmt.Sprintf("%s read -> fence %d, %d writes", who, o.Fence, o.Writes)
	case "acquire":
		if o.Slot > 0 {
			return fmt.Sprintf("%s acquire -> %s, slot %d of %d, fence %d", who, o.Result, o.Slot, o.Slots, o.Fence)
		}
		return fmt.Sprintf("%s acquire -> %s, fence %d", who, o.Result, o.Fence)
	}
	if o.Slot > 0 {
		return fmt.Sprintf("%s %s slot %d fence %d -> %s", who, o.Kind, o.Slot, o.Fence, o.Result)
	}
	return fmt.Sprintf("%s %s fence %d -> %s", who, o.Kind, o.Fence, o.Result)
}

// A history is what readHistory makes of a file: the operations the model
// checks, and what it left out.
type history struct {
	ops     []porcupine.Operation
	lines   int // operations in the file
	skipped int // refusals, and writes rolled back (doc.go: not checked)
	unknown int // operations of unknown outcome
	names   map[string]bool
}

// readHistory reads a history file. An operation whose outcome is unknown
// may take effect at any time after its call: its return is put after
// every other operation's. Refused acquires and writes the server rolled
// back change nothing and are left out; so are acquires of unknown
// outcome (doc.go says why).
func readHistory(r io.Reader) (history, error) {
	h := history{names: map[string]bool{}}
	clients := map[[2]int]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var last int64
	var open []int
	for sc.Scan() {
		h.lines++
		var o op
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			return h, fmt.Errorf("line %d: %w", h.lines, err)
		}
		if err := o.valid(); err != nil {
			return h, fmt.Errorf("line %d: %w", h.lines, err)
		}
		if o.Set > 0 && o.Result == "notheld" && (o.Kind == "refresh" || o.Kind == "release") {
			// A set's refresh or release that found one of its leases
			// lost still extends or deletes the others.
			o.Result = "unknown"
		}
		last = max(last, o.Return)
		if o.Result == "refused" && o.Kind == "acquire" || o.Result == "none" ||
			o.Result == "unknown" && o.Kind == "acquire" {
			h.skipped++
			continue
		}
		h.names[o.Name] = true
		id, ok := clients[[2]int{o.Proc, o.Goroutine}]
		if !ok {
			id = len(clients)
			clients[[2]int{o.Proc, o.Goroutine}] = id
		}
		if o.Result == "unknown" {
			h.unknown++
			open = append(open, len(h.ops))
		}
		h.ops = append(h.ops, porcupine.Operation{ClientId: id, Input: o, Call: o.Call, Output: o.Result, Return: o.Return})
	}
	if err := sc.Err(); err != nil {
		return h, err
	}
	for _, i := range open {
		h.ops[i].Return = min(last+1, math.MaxInt64)
	}
	orderAcquires(h.ops)
	return h, nil
}

// orderAcquires sets each successful acquire's Prev. The model takes a
// name's acquisitions in the order of their fences, and every recorded one
// must be taken, so an acquire can only come once the one with the next
// lower fence has: the model checks that (step), and the search no longer
// tries the acquires that overlap in time in every increasing order, only
// to find each order but one stuck. With Acquire's waiting (sqllock-stress
// -wakeups) a name has a dozen or more acquires in flight at once, and
// those orders made one history of 2,300 operations a name outgrow a minute
// and 8 GB. Acquires of unknown outcome are left out of the history, so a
// fence they took is in no Prev, and the next recorded one follows the one
// before it as before.
func orderAcquires(ops []porcupine.Operation) {
	fences := map[string][]uint64{}
	for _, o := range ops {
		if in := o.Input.(op); in.Kind == "acquire" && in.Result == "ok" {
			fences[in.Name] = append(fences[in.Name], in.Fence)
		}
	}
	for _, fs := range fences {
		slices.Sort(fs)
	}
	for i := range ops {
		in := ops[i].Input.(op)
		if in.Kind != "acquire" || in.Result != "ok" {
			continue
		}
		fs := fences[in.Name]
		if j, _ := slices.BinarySearch(fs, in.Fence); j > 0 {
			in.Prev = fs[j-1]
		}
		ops[i].Input = in
	}
}

// results lists the results each kind of operation may have.
var results = map[string][]string{
	"acquire": {"ok", "refused", "unknown"},
	"refresh": {"ok", "notheld", "unknown"},
	"release": {"ok", "notheld", "unknown"},
	"write":   {"ok", "rejected", "unknown", "none"},
	"cwrite":  {"ok", "refused", "unknown", "none"},
	"read":    {"ok"},
}

func (o op) valid() error {
	rs, ok := results[o.Kind]
	switch {
	case !ok:
		return fmt.Errorf("unknown kind %q", o.Kind)
	case !slices.Contains(rs, o.Result):
		return fmt.Errorf("%s: result %q, want one of %q", o.Kind, o.Result, rs)
	case o.Name == "":
		return fmt.Errorf("%s without a name", o.Kind)
	case o.Return < o.Call:
		return fmt.Errorf("%s returned (%d) before its call (%d)", o.Kind, o.Return, o.Call)
	case o.Result == "ok" && o.Fence == 0 && o.Kind != "read":
		return fmt.Errorf("%s ok without a fence", o.Kind)
	case (o.Kind == "acquire" || o.Kind == "refresh") && o.Result == "ok" && o.TTL <= 0:
		return fmt.Errorf("%s ok without a ttl", o.Kind)
	case o.Slot < 0 || o.Slot > maxSlots:
		return fmt.Errorf("%s on slot %d: the model holds slots 1 to %d", o.Kind, o.Slot, maxSlots)
	case o.Slot > 0 && o.Kind != "acquire" && o.Kind != "release" && o.Kind != "refresh":
		return fmt.Errorf("%s on a slot", o.Kind)
	}
	return nil
}
