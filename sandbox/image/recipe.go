package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Labels set on every base image.
const (
	// LabelRecipeHash holds the hash of the recipe the image was built from.
	LabelRecipeHash = "io.rollout.recipe-hash"
	// LabelRecipe holds the recipe name (bookworm, busybox).
	LabelRecipe = "io.rollout.recipe"
	// LabelUser names the non-root user the image provides.
	LabelUser = "io.rollout.sandbox.user"
)

// Repository is the image repository of the sandbox base images; the tag
// is the recipe name.
const Repository = "rollout-sandbox"

// Kind says what a base image is for.
type Kind int

const (
	// Sandbox images run rollouts (rollout-sandbox:<name>).
	Sandbox Kind = iota
	// Engine images run an inference engine for tests and local use
	// (e.g. rollout-llamacpp:sid); they are never sandboxes.
	Engine
	// Lab images are infrastructure for the project's own test cluster
	// (rollout-k8s-node:bookworm, docs/kubernetes.md); never sandboxes.
	Lab
	// Harness images are sandboxes for harness envs (an outside agent
	// harness and its SDKs installed, rollout-harness:sid); built only
	// when named, not by `--name all`, make image or make test.
	Harness
)

// recipeFormat is bumped when the way recipes are turned into images changes
// in a way the recipe text does not show (e.g. the tar rewriting), so every
// image is rebuilt once.
const recipeFormat = "rollout-recipe/1"

// agentUser is the layer added to every base image.
var agentUser = userLayer{User: "agent", UID: 1000, GID: 1000, Home: "/home/agent", Shell: "/bin/sh", Workspace: "/workspace"}

// recipe is one base image.
type recipe struct {
	name string
	doc  string
	// kind is Sandbox unless set; ref overrides Repository:name.
	kind Kind
	ref  string
	// spec returns the canonical description of everything that determines
	// the image; its hash is the recipe hash. It must be cheap: it runs on
	// every Ensure.
	spec func(ctx context.Context) (string, error)
	// prepare makes sure the host tools the spec needs exist (installing
	// them as root); nil when spec needs none.
	prepare func(ctx context.Context, log io.Writer) error
	// rootfs writes the root filesystem tar (before the user layer) to w.
	rootfs func(ctx context.Context, w io.Writer, log io.Writer) error
	// changes are Dockerfile instructions applied on import.
	changes []string
	layer   userLayer
	// prune drops paths from the rootfs on its way to the engine.
	prune []pruneRule
}

var recipes = map[string]*recipe{}

func addRecipe(r *recipe) { recipes[r.name] = r }

// Names lists the sandbox base image recipes, sorted: what `rollout sandbox
// image build` builds by default and `rollout doctor` requires.
func Names() []string { return KindNames(Sandbox) }

// EngineNames lists the engine image recipes (see docs/real-engines.md),
// sorted. They are built only on request.
func EngineNames() []string { return KindNames(Engine) }

// HarnessNames lists the harness image recipes, sorted. They are built
// only on request.
func HarnessNames() []string { return KindNames(Harness) }

// KindNames lists the recipes of one kind, sorted.
func KindNames(k Kind) []string {
	out := make([]string, 0, len(recipes))
	for n, r := range recipes {
		if r.kind == k {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Ref is the image reference of the named base image:
// rollout-sandbox:<name> for sandbox images, the recipe's own reference
// for engine images (rollout-llamacpp:sid).
func Ref(name string) string {
	if r, ok := recipes[name]; ok && r.ref != "" {
		return r.ref
	}
	return Repository + ":" + name
}

// Describe returns a one-line description of the named recipe.
func Describe(name string) (string, error) {
	r, err := lookup(name)
	if err != nil {
		return "", err
	}
	return r.doc, nil
}

func lookup(name string) (*recipe, error) {
	r, ok := recipes[name]
	if !ok {
		all := append(append(Names(), EngineNames()...), HarnessNames()...)
		sort.Strings(all)
		return nil, fmt.Errorf("%w: %q (known: %s)", ErrUnknownRecipe, name, strings.Join(all, ", "))
	}
	return r, nil
}

// RecipeHash returns the current hash of the named recipe: what the
// image's io.rollout.recipe-hash label must equal for it to be current.
func RecipeHash(ctx context.Context, name string) (string, error) {
	r, err := lookup(name)
	if err != nil {
		return "", err
	}
	return r.hash(ctx)
}

func (r *recipe) hash(ctx context.Context) (string, error) {
	spec, err := r.spec(ctx)
	if err != nil {
		return "", fmt.Errorf("recipe %s: %w", r.name, err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\nname=%s\n%s\nlayer: %s\n", recipeFormat, r.name, spec, r.layer.spec())
	if r.ref != "" {
		fmt.Fprintf(h, "ref: %s\n", r.ref)
	}
	for _, p := range r.prune {
		fmt.Fprintf(h, "prune: %s\n", p)
	}
	for _, c := range r.changes {
		fmt.Fprintf(h, "change: %s\n", c)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
