package nat

import (
	"fmt"
	"testing"
)

// Ids stay below the number of service ports held at once: a freed id is
// handed out again, lowest first, after the Apply that freed it.
func TestIDsAreReusedLowestFirst(t *testing.T) {
	a := newIDAllocator()
	key := func(i int) idKey {
		return idKey{name: ServicePortName{Namespace: "ns", Name: fmt.Sprint(i), Port: "p"}}
	}
	for i := range 100 {
		if id := a.alloc(key(i)); id != uint32(i+1) {
			t.Fatalf("service %d got id %d", i, id)
		}
	}
	for i := 10; i < 60; i++ {
		a.release(key(i), uint32(i+1))
	}
	if _, ok := a.get(key(10)); ok {
		t.Fatal("a released key keeps its id")
	}
	if id, ok := a.get(key(9)); !ok || id != 10 {
		t.Fatalf("a key not released: %d %v", id, ok)
	}
	if id := a.alloc(key(1000)); id != 101 {
		t.Fatalf("an id freed in this Apply was handed out again: %d", id)
	}
	a.releasePending()
	for i := range 50 {
		if id := a.alloc(key(2000 + i)); id != uint32(11+i) {
			t.Fatalf("after the Apply: id %d, want %d (lowest free first)", id, 11+i)
		}
	}
	if id := a.alloc(key(3000)); id != 102 {
		t.Fatalf("once the freed ids are used: %d, want 102", id)
	}
}
