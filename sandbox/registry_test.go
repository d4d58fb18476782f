package sandbox

import (
	"errors"
	"testing"
)

func TestRegistry(t *testing.T) {
	Register(Registration{Name: "test-registry"})
	if _, err := Lookup("test-registry"); err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if _, err := Lookup("no-such-backend"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Lookup of an unknown backend: %v, want ErrInvalid", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a second registration of a name did not panic")
		}
	}()
	Register(Registration{Name: "test-registry"})
}
