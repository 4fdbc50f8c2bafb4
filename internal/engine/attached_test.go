package engine

import (
	"fmt"
	"sync"
	"testing"
)

// attachedSeen remembers a name until it is dropped, and no more than
// attachedNames: past that it starts again from the name put in.
func TestAttachedSeen(t *testing.T) {
	var a attachedSeen
	if a.has("x") {
		t.Fatal("the zero value has x")
	}
	a.drop("x") // nothing to drop: no panic
	a.add("x")
	a.add("x")
	if !a.has("x") || a.has("y") || a.n.Load() != 1 {
		t.Fatalf("after adding x twice: has x %v, y %v, count %d; want x alone", a.has("x"), a.has("y"), a.n.Load())
	}
	a.drop("x")
	if a.has("x") || a.n.Load() != 0 {
		t.Fatalf("after dropping x: has x %v, count %d", a.has("x"), a.n.Load())
	}
	for i := range attachedNames {
		a.add(fmt.Sprint(i))
	}
	if a.n.Load() != attachedNames || !a.has("0") {
		t.Fatalf("full: count %d, has the first %v", a.n.Load(), a.has("0"))
	}
	a.add("past")
	if a.n.Load() != 1 || !a.has("past") || a.has("0") {
		t.Fatalf("past the bound: count %d, has the new %v, the first %v; want the new one alone", a.n.Load(), a.has("past"), a.has("0"))
	}
}

// Its calls are safe together (go test -race).
func TestAttachedSeen_concurrent(t *testing.T) {
	var a attachedSeen
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				n := fmt.Sprint(g, i%7)
				a.add(n)
				a.has(n)
				a.drop(n)
			}
		}()
	}
	wg.Wait()
	if a.n.Load() != 0 {
		t.Fatalf("every name dropped by the goroutine that added it: count %d, want 0", a.n.Load())
	}
}
