package image

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// The harness image is built only when named: not by `--name all`, make
// image or make test, and not required by doctor.
func TestHarnessRecipeIsBuiltOnlyWhenNamed(t *testing.T) {
	if got := Ref("harness"); got != "rollout-harness:sid" {
		t.Errorf("Ref(harness) = %q", got)
	}
	if slices.Contains(Names(), "harness") || slices.Contains(EngineNames(), "harness") {
		t.Errorf("Names() %v, EngineNames() %v: the harness image must be neither", Names(), EngineNames())
	}
	if got := HarnessNames(); !slices.Equal(got, []string{"harness"}) {
		t.Errorf("HarnessNames() = %v", got)
	}
	spec, err := recipes["harness"].spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"suite=sid", "python3-openai", "python3-anthropic", "curl", "suites=sid\n", "customize: PYTHONDONTWRITEBYTECODE=1 python3 -c 'import openai, anthropic'"} {
		if !strings.Contains(spec+"\n", want) {
			t.Errorf("spec lacks %q:\n%s", want, spec)
		}
	}
}
