package secrets

import (
	"errors"
	"testing"
)

func TestLookup(t *testing.T) {
	t.Setenv("ROLLOUT_TEST_KEY", "k1")
	t.Setenv("OTHER_SECRET", "s")
	if v, err := Lookup("ROLLOUT_TEST_KEY"); err != nil || v != "k1" {
		t.Fatalf("unrestricted: %q %v", v, err)
	}
	if _, err := Lookup("ROLLOUT_TEST_UNSET"); err == nil || errors.Is(err, ErrNotAllowed) {
		t.Fatalf("unset: %v", err)
	}
	lift := Restrict([]string{"ROLLOUT_TEST_*", "EXACT"})
	if v, err := Lookup("ROLLOUT_TEST_KEY"); err != nil || v != "k1" {
		t.Fatalf("allowed by prefix: %q %v", v, err)
	}
	if _, err := Lookup("OTHER_SECRET"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("outside the restriction: %v", err)
	}
	if Allowed("EXACTLY") || !Allowed("EXACT") {
		t.Fatal("an exact name matched as a prefix")
	}
	lift()
	if _, err := Lookup("OTHER_SECRET"); err != nil {
		t.Fatalf("after lifting: %v", err)
	}
	defer Restrict(nil)()
	if _, err := Lookup("ROLLOUT_TEST_KEY"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("no patterns allow nothing: %v", err)
	}
}
