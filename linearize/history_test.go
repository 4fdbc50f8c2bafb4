package main

import (
	"strings"
	"testing"
)

// readHistory leaves out what changes nothing, moves the return of an
// operation of unknown outcome past every other, and takes a set's refresh
// or release that found a lease lost as of unknown outcome.
func TestReadHistory(t *testing.T) {
	in := strings.Join([]string{
		`{"k":"acquire","n":"x","p":0,"g":0,"f":1,"r":"ok","c":10,"t":20,"ttl":100}`,
		`{"k":"acquire","n":"x","p":1,"g":0,"r":"refused","c":11,"t":21,"ttl":100}`,
		`{"k":"acquire","n":"x","p":1,"g":1,"r":"unknown","c":12,"t":22,"ttl":100}`,
		`{"k":"write","n":"x","p":0,"g":0,"f":1,"r":"none","c":30,"t":40}`,
		`{"k":"write","n":"x","p":0,"g":0,"f":1,"r":"unknown","c":41,"t":42}`,
		`{"k":"refresh","n":"y","p":2,"g":0,"f":1,"r":"notheld","c":43,"t":44,"ttl":100,"set":2}`,
		`{"k":"release","n":"y","p":2,"g":0,"f":1,"r":"notheld","c":45,"t":46,"set":2}`,
		`{"k":"release","n":"x","p":0,"g":0,"f":1,"r":"notheld","c":47,"t":48}`,
		`{"k":"read","n":"x","p":-1,"g":0,"f":1,"r":"ok","c":50,"t":60,"w":1}`,
	}, "\n")
	h, err := readHistory(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if h.lines != 9 || h.skipped != 3 || h.unknown != 3 || len(h.ops) != 6 || len(h.names) != 2 {
		t.Fatalf("got %d lines, %d skipped, %d unknown, %d operations on %d names; want 9, 3, 3, 6 on 2",
			h.lines, h.skipped, h.unknown, len(h.ops), len(h.names))
	}
	for _, o := range h.ops {
		in := o.Input.(op)
		wantReturn := in.Return
		if o.Output == "unknown" {
			wantReturn = 61
		}
		if o.Return != wantReturn || o.Call != in.Call {
			t.Errorf("%v: call %d, return %d; want %d, %d", in, o.Call, o.Return, in.Call, wantReturn)
		}
		if in.Name == "y" && o.Output != "unknown" {
			t.Errorf("%v: result %v, want unknown (a set's)", in, o.Output)
		}
		if in.Kind == "release" && in.Name == "x" && o.Output != "notheld" {
			t.Errorf("%v: result %v, want notheld (a single name's)", in, o.Output)
		}
	}
	if h.ops[0].ClientId == h.ops[len(h.ops)-1].ClientId {
		t.Errorf("the parent and p0/g0 share client id %d", h.ops[0].ClientId)
	}
}

func TestReadHistory_badLines(t *testing.T) {
	for _, tt := range []struct{ line, want string }{
		{`{"k":"acquire"`, "line 2: unexpected end of JSON input"},
		{`{"k":"steal","n":"x","r":"ok"}`, `line 2: unknown kind "steal"`},
		{`{"k":"write","n":"x","f":1,"r":"notheld"}`, `line 2: write: result "notheld"`},
		{`{"k":"write","f":1,"r":"ok"}`, "line 2: write without a name"},
		{`{"k":"write","n":"x","f":1,"r":"ok","c":5,"t":4}`, "line 2: write returned (4) before its call (5)"},
		{`{"k":"write","n":"x","r":"ok"}`, "line 2: write ok without a fence"},
		{`{"k":"acquire","n":"x","f":1,"r":"ok"}`, "line 2: acquire ok without a ttl"},
		{`{"k":"acquire","n":"x","f":1,"r":"ok","ttl":1,"slot":17,"slots":17}`, "line 2: acquire on slot 17: the model holds slots 1 to 16"},
		{`{"k":"write","n":"x","f":1,"r":"ok","slot":1}`, "line 2: write on a slot"},
	} {
		good := `{"k":"read","n":"x","r":"ok"}` + "\n"
		_, err := readHistory(strings.NewReader(good + tt.line + "\n"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error with %q", tt.line, err, tt.want)
		}
	}
}
