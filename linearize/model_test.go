package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Times in these histories are in ms; leases last 100.
const ms = int64(time.Millisecond)

// h builds a history from lines "kind name proc fence result call return
// [w=writes] [ka] [set] [slot=N]", times in ms, ttl 100 ms; a slot is of a
// semaphore of 2.
func h(t *testing.T, lines ...string) history {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 7 {
			t.Fatalf("bad line %q", l)
		}
		o := op{Kind: f[0], Name: f[1], Proc: atoi(t, f[2]), Fence: uint64(atoi(t, f[3])), Result: f[4],
			Call: int64(atoi(t, f[5])) * ms, Return: int64(atoi(t, f[6])) * ms, TTL: 100 * ms}
		for _, x := range f[7:] {
			switch {
			case x == "ka":
				o.KeepAlive = true
			case x == "set":
				o.Set = 2
			case strings.HasPrefix(x, "w="):
				o.Writes = int64(atoi(t, x[2:]))
			case strings.HasPrefix(x, "slot="):
				o.Slot, o.Slots = atoi(t, x[5:]), 2
			default:
				t.Fatalf("bad field %q", x)
			}
		}
		line, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	hist, err := readHistory(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return hist
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func check(t *testing.T, hist history) porcupine.CheckResult {
	t.Helper()
	return porcupine.CheckOperationsTimeout(newModel(ms), hist.ops, 10*time.Second)
}

func TestModel_accepts(t *testing.T) {
	for _, tt := range []struct {
		name  string
		lines []string
	}{
		{"one holder after another, released", []string{
			"acquire x 0 1 ok 0 2", "write x 0 1 ok 3 4", "release x 0 1 ok 5 6",
			"acquire x 1 2 ok 7 9", "write x 1 2 ok 10 11", "release x 1 2 ok 12 13",
			"read x -1 2 ok 20 21 w=2"}},
		{"a takeover after the lease expired, the old holder's write refused", []string{
			"acquire x 0 1 ok 0 2", "write x 0 1 ok 3 4",
			"acquire x 1 2 ok 101 103", "write x 1 2 ok 104 105",
			"write x 0 1 rejected 150 151", "release x 0 1 notheld 152 153",
			"release x 1 2 ok 160 161", "read x -1 2 ok 200 201 w=2"}},
		{"a stale write accepted before the new holder wrote (fencing allows it)", []string{
			"acquire x 0 1 ok 0 2",
			"acquire x 1 2 ok 101 103", "write x 0 1 ok 104 105", "write x 1 2 ok 106 107",
			"read x -1 2 ok 200 201 w=2"}},
		{"overlapping calls ordered by the fences", []string{
			"acquire x 0 1 ok 0 10", "acquire x 1 2 ok 5 120", "write x 1 2 ok 121 122",
			"read x -1 2 ok 200 201 w=1"}},
		{"a refresh keeps the lease; a takeover waits for the refreshed expiry", []string{
			"acquire x 0 1 ok 0 2", "refresh x 0 1 ok 50 52", "release x 0 1 notheld 170 171",
			"acquire x 1 2 ok 150 160"}},
		{"a write of unknown outcome, applied", []string{
			"acquire x 0 1 ok 0 2", "write x 0 1 unknown 3 4", "read x -1 1 ok 200 201 w=1"}},
		{"a write of unknown outcome, not applied", []string{
			"acquire x 0 1 ok 0 2", "write x 0 1 unknown 3 4", "read x -1 0 ok 200 201 w=0"}},
		{"a release of unknown outcome lets the next holder in before the expiry", []string{
			"acquire x 0 1 ok 0 2", "release x 0 1 unknown 3 4", "acquire x 1 2 ok 10 12"}},
		{"a refresh of unknown outcome may have kept the lease: a later checked write commits", []string{
			"acquire x 0 1 ok 0 2", "refresh x 0 1 unknown 50 52", "cwrite x 0 1 ok 130 131",
			"read x -1 1 ok 200 201 w=1"}},
		{"checked writes while live; refused once taken over", []string{
			"acquire x 0 1 ok 0 2", "cwrite x 0 1 ok 3 4", "acquire x 1 2 ok 101 103",
			"cwrite x 0 1 refused 104 105", "cwrite x 1 2 ok 106 107", "read x -1 2 ok 200 201 w=2"}},
		{"a set's refresh that found one lease lost still extended the other", []string{
			"acquire x 0 1 ok 0 2 set", "refresh x 0 1 notheld 50 52 set", "cwrite x 0 1 ok 130 131",
			"read x -1 1 ok 200 201 w=1"}},
		{"under a keep-alive the lease has no upper bound", []string{
			"acquire x 0 1 ok 0 2 ka", "cwrite x 0 1 ok 500 501", "read x -1 1 ok 600 601 w=1"}},
		{"names are independent", []string{
			"acquire x 0 5 ok 0 2", "acquire y 1 1 ok 3 4", "write y 1 1 ok 5 6", "write x 0 5 ok 5 6",
			"read x -1 5 ok 200 201 w=1", "read y -1 1 ok 200 201 w=1"}},
		{"a semaphore of 2: two holders at once, one per slot, fences across its slots", []string{
			"acquire s 0 1 ok 0 2 slot=1", "acquire s 1 2 ok 3 4 slot=2", "release s 0 1 ok 5 6 slot=1",
			"acquire s 2 3 ok 7 8 slot=1", "release s 1 2 notheld 150 151 slot=2", "acquire s 0 4 ok 120 121 slot=2"}},
		{"refusals and acquires of unknown outcome are not checked", []string{
			"acquire x 0 0 refused 0 2", "acquire x 0 0 unknown 3 4", "acquire x 1 1 ok 5 6"}},
		{"a fence an acquire of unknown outcome took is a gap the next one skips", []string{
			"acquire x 0 1 ok 0 2", "release x 0 1 ok 3 4", "acquire x 2 0 unknown 5 6",
			"acquire x 1 3 ok 7 8", "read x -1 0 ok 200 201 w=0"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := check(t, h(t, tt.lines...)); got != porcupine.Ok {
				t.Errorf("got %v, want %v", got, porcupine.Ok)
			}
		})
	}
}

func TestModel_rejects(t *testing.T) {
	for _, tt := range []struct {
		name  string
		lines []string
	}{
		{"two holders: a takeover while the lease was live", []string{
			"acquire x 0 1 ok 0 2", "acquire x 1 2 ok 10 12"}},
		{"two holders: overlapping writes accepted with fences out of order", []string{
			"acquire x 0 1 ok 0 2", "acquire x 1 2 ok 101 103",
			"write x 1 2 ok 104 110", "write x 0 1 ok 111 112"}},
		{"a stale write accepted after the register saw a higher fence", []string{
			"acquire x 0 1 ok 0 2", "acquire x 1 2 ok 101 103", "write x 1 2 ok 104 105",
			"write x 0 1 ok 150 151"}},
		{"a fence issued twice", []string{
			"acquire x 0 1 ok 0 2", "release x 0 1 ok 3 4", "acquire x 1 1 ok 5 6"}},
		{"fences out of acquisition order", []string{
			"acquire x 0 5 ok 0 2", "release x 0 5 ok 3 4", "acquire x 1 3 ok 5 6"}},
		{"a write refused though no higher fence was written", []string{
			"acquire x 0 1 ok 0 2", "write x 0 1 rejected 3 4"}},
		{"a released lease refreshed", []string{
			"acquire x 0 1 ok 0 2", "release x 0 1 ok 3 4", "refresh x 0 1 ok 5 6"}},
		{"an expired lease refreshed", []string{
			"acquire x 0 1 ok 0 2", "refresh x 0 1 ok 150 151"}},
		{"a released lease's holder released it again", []string{
			"acquire x 0 1 ok 0 2", "acquire x 1 2 ok 150 151", "release x 0 1 ok 152 153"}},
		{"a live lease found not held", []string{
			"acquire x 0 1 ok 0 2", "refresh x 0 1 notheld 10 11"}},
		{"a checked write committed after the lease was taken over", []string{
			"acquire x 0 1 ok 0 2", "acquire x 1 2 ok 101 103", "cwrite x 0 1 ok 104 105"}},
		{"a checked write committed after the lease expired", []string{
			"acquire x 0 1 ok 0 2", "cwrite x 0 1 ok 150 151"}},
		{"an acknowledged write lost", []string{
			"acquire x 0 1 ok 0 2", "write x 0 1 ok 3 4", "write x 0 1 ok 5 6", "read x -1 1 ok 200 201 w=1"}},
		{"a stale checked write took the register back", []string{
			"acquire x 0 1 ok 0 2", "cwrite x 0 1 ok 3 4", "acquire x 1 2 ok 101 103", "cwrite x 1 2 ok 104 105",
			"read x -1 1 ok 200 201 w=2"}},
		{"a write with a fence nobody acquired", []string{
			"acquire x 0 1 ok 0 2", "write x 1 7 ok 3 4"}},
		{"a semaphore's slot held twice", []string{
			"acquire s 0 1 ok 0 2 slot=1", "acquire s 1 2 ok 3 4 slot=1"}},
		{"a semaphore's slots: fences out of order across them", []string{
			"acquire s 0 5 ok 0 2 slot=1", "acquire s 1 2 ok 3 4 slot=2"}},
		{"a semaphore of 2 with a third slot", []string{
			"acquire s 0 1 ok 0 2 slot=3"}},
		{"a keep-alive's lease taken over before its first expiry", []string{
			"acquire x 0 1 ok 0 2 ka", "acquire x 1 2 ok 50 60"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := check(t, h(t, tt.lines...)); got != porcupine.Illegal {
				t.Errorf("got %v, want %v", got, porcupine.Illegal)
			}
		})
	}
}

// Forty acquires in flight at once, as callers waiting in Acquire make
// them, each granted in turn in an order other than their calls': the check
// decides it at once. Before the model took acquires in the order of their
// fences (orderAcquires), it tried them in every increasing order and did
// not decide within check's 10 s.
func TestModel_manyAcquiresInFlight(t *testing.T) {
	const n = 40
	var lines []string
	for k := range n {
		// The k-th holder (fence k+1) called at (k*7)%n ms, got the name at
		// 100+20k, wrote and released it.
		call, got := (k*7)%n, 100+20*k
		lines = append(lines,
			fmt.Sprintf("acquire x %d %d ok %d %d", k, k+1, call, got),
			fmt.Sprintf("write x %d %d ok %d %d", k, k+1, got+1, got+2),
			fmt.Sprintf("release x %d %d ok %d %d", k, k+1, got+3, got+4))
	}
	lines = append(lines, fmt.Sprintf("read x -1 %d ok %d %d w=%d", n, 100+20*n, 101+20*n, n))
	if got := check(t, h(t, lines...)); got != porcupine.Ok {
		t.Errorf("got %v, want %v", got, porcupine.Ok)
	}
}

// The slack accepts clocks that disagree by less than it, and only that.
func TestModel_slack(t *testing.T) {
	hist := h(t, "acquire x 0 1 ok 0 2", "acquire x 1 2 ok 95 98")
	for _, tt := range []struct {
		slack int64
		want  porcupine.CheckResult
	}{{0, porcupine.Illegal}, {ms, porcupine.Illegal}, {2 * ms, porcupine.Ok}} {
		if got := porcupine.CheckOperationsTimeout(newModel(tt.slack), hist.ops, 10*time.Second); got != tt.want {
			t.Errorf("slack %v: got %v, want %v", time.Duration(tt.slack), got, tt.want)
		}
	}
}
