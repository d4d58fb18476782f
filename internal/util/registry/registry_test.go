package registry

import (
	"slices"
	"sync"
	"testing"
)

func TestRegistry(t *testing.T) {
	r := New[int]("thing")
	r.Register("b", 2)
	r.Register("a", 1)
	if v, ok := r.Lookup("a"); !ok || v != 1 {
		t.Fatalf("Lookup(a) = %v %v", v, ok)
	}
	if _, ok := r.Lookup("c"); ok {
		t.Fatal("Lookup of an unregistered name succeeded")
	}
	if got := r.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Names = %v, want sorted [a b]", got)
	}
	func() {
		defer func() {
			if p := recover(); p != "thing a registered twice" {
				t.Fatalf("duplicate: panic %v", p)
			}
		}()
		r.Register("a", 3)
	}()
	// Concurrent readers (the race detector checks the locking).
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, _ = r.Lookup("b")
			_ = r.Names()
		})
	}
	wg.Wait()
}
