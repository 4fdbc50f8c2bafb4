package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/sqllock/sqllock"
)

// The history (-history FILE): every operation of the run, one JSON line
// each, with the times it was invoked and returned, for an independent
// linearizability check against a model of the lock and the fenced
// register (the linearize module beside the root reads it; its doc.go
// describes the format and the model). The children send their operations
// to the parent with their records; the parent writes them to the file,
// then its own final read of each name's register.
//
// Every process stamps times on one clock: the host's wall clock read once
// when the process starts, advanced by the monotonic clock from then on.
// The processes of a run share the host, so their stamps compare, and a
// step of the wall clock during the run moves none of them. The servers of
// these runs read the same host clock (UTC_TIMESTAMP), which the model's
// lease rules rely on.

// A histOp is one operation of the history.
type histOp struct {
	// Kind: acquire, refresh, release, write (a fenced write to the
	// register), cwrite (a write made after Lock.Check in its transaction,
	// to a register without a fence guard), read (the parent's final read).
	Kind      string `json:"k"`
	Name      string `json:"n"`
	Proc      int    `json:"p"` // -1: the parent
	Goroutine int    `json:"g"`
	Fence     uint64 `json:"f,omitempty"`
	// Result: ok; refused (an acquire refused, or a cwrite whose
	// Lock.Check found the lease lost); rejected (a fenced write the
	// register refused); notheld (a refresh or release that found the
	// lease not ours); unknown (an error left the outcome unknown); none
	// (a write the server rolled back: not applied).
	Result string `json:"r"`
	// Call and Return are when the operation was invoked and returned, in
	// ns since 1970 on the run's clock (above).
	Call   int64 `json:"c"`
	Return int64 `json:"t"`
	// TTL is an acquire's or a refresh's lease length, in ns.
	TTL int64 `json:"ttl,omitempty"`
	// KeepAlive: the holder keeps its lease with Lock.KeepAlive, whose
	// renewals are not in the history.
	KeepAlive bool `json:"ka,omitempty"`
	// Set is the number of names of the set the operation took, refreshed
	// or released at once (TryAcquireSet), recorded once for each name.
	Set int `json:"set,omitempty"`
	// Writes is what a read found: the register's count of writes (its
	// fence is Fence).
	Writes int64 `json:"w,omitempty"`
	// Slot and Slots: the semaphore mode's operations are on slot Slot (1
	// to Slots; 0 when unknown) of a semaphore of Slots.
	Slot  int `json:"slot,omitempty"`
	Slots int `json:"slots,omitempty"`
}

// clockBase is when this process started, with its monotonic reading.
var clockBase = time.Now()

// stamp is now on the run's clock: ns since 1970.
func stamp() int64 { return clockBase.UnixNano() + int64(time.Since(clockBase)) }

// opResult is the history's result of an operation that returned err:
// notOK is what a refusal is called for that operation.
func opResult(err error, notOK string) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, sqllock.ErrNotAcquired), errors.Is(err, sqllock.ErrNotHeld):
		return notOK
	}
	return "unknown"
}

// hist sends op to the parent, when the run keeps a history.
func (w *worker) hist(op histOp) {
	if w.cfg.history == "" {
		return
	}
	op.Proc = w.cfg.child
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.out.Encode(struct {
		H histOp `json:"h"`
	}{op}); err != nil {
		w.report.Errors = append(w.report.Errors, err.Error())
	}
}

// A history is the parent's history file, written as operations arrive.
type history struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	err error
	n   int
}

func createHistory(path string) (*history, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &history{f: f, w: bufio.NewWriterSize(f, 1<<16)}, nil
}

// add writes one operation, as its JSON line. h may be nil.
func (h *history) add(line []byte) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		_, h.err = h.w.Write(append(line, '\n'))
		h.n++
	}
}

func (h *history) addOp(op histOp) {
	if h == nil {
		return
	}
	b, err := json.Marshal(op)
	if err != nil {
		h.mu.Lock()
		h.err = errors.Join(h.err, err)
		h.mu.Unlock()
		return
	}
	h.add(b)
}

// close flushes and closes the file, returning the first error met.
func (h *history) close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.f == nil {
		return nil // closed already
	}
	err := h.err
	if ferr := h.w.Flush(); err == nil {
		err = ferr
	}
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	h.f = nil
	return err
}
