package doctor

import (
	"context"
	"io"
	"strings"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	imagetypes "github.com/moby/moby/api/types/image"
	"github.com/moby/moby/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/sandbox/image"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestVersionLess(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"1.41", "1.40", false},
		{"1.40", "1.40", false},
		{"1.39", "1.40", true},
		{"1.9", "1.40", true},
		{"2.0", "1.40", false},
		{"1.40.1", "1.40", false},
	} {
		if got := versionLess(tt.a, tt.b); got != tt.want {
			t.Errorf("versionLess(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

// fakeImages answers ImageInspect from a map; the other methods are not
// used by the doctor.
type fakeImages struct{ labels map[string]map[string]string }

var _ image.API = fakeImages{}

func (f fakeImages) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	l, ok := f.labels[ref]
	if !ok {
		return client.ImageInspectResult{}, cerrdefs.ErrNotFound
	}
	return client.ImageInspectResult{InspectResponse: imagetypes.InspectResponse{
		ID:     "sha256:0123456789abcdef",
		Config: &dockerspec.DockerOCIImageConfig{ImageConfig: ocispec.ImageConfig{Labels: l}},
	}}, nil
}
func (fakeImages) ImageImport(context.Context, client.ImageImportSource, string, client.ImageImportOptions) (client.ImageImportResult, error) {
	panic("not used")
}
func (fakeImages) ImageTag(context.Context, client.ImageTagOptions) (client.ImageTagResult, error) {
	panic("not used")
}
func (fakeImages) ImageRemove(context.Context, string, client.ImageRemoveOptions) (client.ImageRemoveResult, error) {
	panic("not used")
}
func (fakeImages) ImageBuild(context.Context, io.Reader, client.ImageBuildOptions) (client.ImageBuildResult, error) {
	panic("not used")
}

func TestCheckImage(t *testing.T) {
	ctx := t.Context()
	want, err := image.RecipeHash(ctx, "bookworm")
	if err != nil {
		t.Fatal(err)
	}
	ref := image.Ref("bookworm")
	tests := []struct {
		name      string
		labels    map[string]map[string]string
		status    Status
		current   bool
		wantParts []string
	}{
		{name: "missing", labels: nil, status: Fail, wantParts: []string{"missing", "rollout sandbox image build --name bookworm"}},
		{name: "stale", labels: map[string]map[string]string{ref: {image.LabelRecipeHash: "oldhash"}}, status: Fail, wantParts: []string{"stale", "oldhash", want[:12], "--name bookworm"}},
		{name: "no label", labels: map[string]map[string]string{ref: {}}, status: Fail, wantParts: []string{"stale (recipe none"}},
		{name: "current", labels: map[string]map[string]string{ref: {image.LabelRecipeHash: want}}, status: OK, current: true, wantParts: []string{"present", want[:12]}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Report
			got := checkImage(ctx, &r, fakeImages{labels: tt.labels}, "bookworm")
			if got != tt.current || len(r.Checks) != 1 {
				t.Fatalf("current = %v, checks %v", got, r.Checks)
			}
			c := r.Checks[0]
			if c.Status != tt.status || c.Name != "image "+ref {
				t.Errorf("check = %+v", c)
			}
			for _, p := range tt.wantParts {
				if !strings.Contains(c.Detail, p) {
					t.Errorf("detail %q lacks %q", c.Detail, p)
				}
			}
			if r.OK() != (tt.status != Fail) {
				t.Errorf("Report.OK() = %v for status %v", r.OK(), tt.status)
			}
		})
	}
}

func TestCheckDiskAndDriver(t *testing.T) {
	var r Report
	checkDisk(&r, t.TempDir())
	checkDriver(&r, "vfs")
	checkDriver(&r, "overlay2")
	if len(r.Checks) != 3 {
		t.Fatalf("checks: %v", r.Checks)
	}
	if !strings.Contains(r.Checks[0].Detail, "GiB free in") {
		t.Errorf("disk: %+v", r.Checks[0])
	}
	if r.Checks[1].Status != Warn || !strings.Contains(r.Checks[1].Detail, "overlay2") {
		t.Errorf("vfs: %+v", r.Checks[1])
	}
	if r.Checks[2].Status != OK {
		t.Errorf("overlay2: %+v", r.Checks[2])
	}
	if line := (Check{Name: "disk", Status: Fail, Detail: "x"}).String(); line != "FAIL  disk: x" {
		t.Errorf("line format %q", line)
	}
}
