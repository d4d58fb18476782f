package image

import (
	"context"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

func TestLlamacppRecipeIsAnEngineImage(t *testing.T) {
	if got := Ref("llamacpp"); got != "rollout-llamacpp:sid" {
		t.Errorf("Ref(llamacpp) = %q", got)
	}
	if slices.Contains(Names(), "llamacpp") {
		t.Errorf("Names() %v: the engine image must not be a sandbox image (doctor and `--name all` would require it)", Names())
	}
	if got := EngineNames(); !slices.Equal(got, []string{"llamacpp"}) {
		t.Errorf("EngineNames() = %v", got)
	}
	if got := Ref("bookworm"); got != "rollout-sandbox:bookworm" {
		t.Errorf("Ref(bookworm) = %q", got)
	}
}

func TestLlamacppSpec(t *testing.T) {
	spec, err := llamacppSid.spec()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"suite=sid ", "suites=sid\n", "llama.cpp-tools", "python3-gguf", `Acquire::Check-Valid-Until "false"`,
		"file /usr/share/rollout/tinyqwen3/make_tiny_gguf.py sha256=",
		"file /usr/share/rollout/tinyqwen3/tiny-qwen3.json sha256=",
		"file /usr/share/rollout/tinyqwen3/corpus.txt sha256=",
		"file /usr/share/rollout/tinyqwen3/chat_template.jinja sha256=",
		"customize: PYTHONDONTWRITEBYTECODE=1 python3 /usr/share/rollout/tinyqwen3/make_tiny_gguf.py --out /models",
	} {
		if !strings.Contains(spec, want) {
			t.Errorf("spec lacks %q:\n%s", want, spec)
		}
	}

	// A changed byte in any generator input is a new recipe.
	changed := *llamacppSid
	changed.files = fstest.MapFS{
		"make_tiny_gguf.py":   {Data: mustRead(t, "make_tiny_gguf.py")},
		"tiny-qwen3.json":     {Data: append(mustRead(t, "tiny-qwen3.json"), ' ')},
		"corpus.txt":          {Data: mustRead(t, "corpus.txt")},
		"chat_template.jinja": {Data: mustRead(t, "chat_template.jinja")},
	}
	spec2, err := changed.spec()
	if err != nil {
		t.Fatal(err)
	}
	if spec2 == spec {
		t.Fatal("editing tiny-qwen3.json did not change the recipe spec")
	}
	h1, err := RecipeHash(context.Background(), "llamacpp")
	if err != nil || len(h1) != 64 {
		t.Fatalf("RecipeHash: %q, %v", h1, err)
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := tinyQwen3Files.ReadFile("tinyqwen3/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLlamacppArgs(t *testing.T) {
	args := strings.Join(llamacppSid.args("/tmp/stage"), "\n")
	for _, want := range []string{
		`--customize-hook=mkdir -p "$1/usr/share/rollout/"`,
		"--customize-hook=copy-in /tmp/stage/tinyqwen3 /usr/share/rollout/",
		`--customize-hook=chroot "$1" /bin/sh -c 'PYTHONDONTWRITEBYTECODE=1 python3 /usr/share/rollout/tinyqwen3/make_tiny_gguf.py --out /models'`,
		"\nsid\n-\ndeb ",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("mmdebstrap args lack %q:\n%s", want, args)
		}
	}
	if strings.Contains(args, "sid-updates") || strings.Contains(args, "sid-security") {
		t.Errorf("sid has no -updates or -security suite:\n%s", args)
	}
	// bookworm has no hooks.
	if b := strings.Join(bookworm.args(""), " "); strings.Contains(b, "customize-hook") {
		t.Errorf("bookworm args have hooks: %s", b)
	}
}
