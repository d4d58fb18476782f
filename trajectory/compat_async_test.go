package trajectory

import (
	"testing"
)

func TestValidateTokenVersions(t *testing.T) {
	r := fixtureRecords()[0]
	if len(r.Tokens) == 0 {
		t.Skip("fixture has no tokens")
	}
	r.TokenVersions = make([]int64, len(r.Tokens)+1)
	if err := r.Validate(); err == nil {
		t.Fatal("misaligned token_versions accepted")
	}
	r.TokenVersions = make([]int64, len(r.Tokens))
	r.VersionCuts = []VersionCut{{Turn: 1, Position: int32(len(r.Tokens)), Kind: "abort", From: 0, To: 1}}
	if err := r.Validate(); err == nil {
		t.Fatal("cut outside the tokens accepted")
	}
	r.VersionCuts[0].Position = -1
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}
