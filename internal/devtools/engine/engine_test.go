package engine

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox/image"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The helper's default command line is the image's own CMD, so
// `docker run rollout-llamacpp:sid` and Start serve the same thing.
func TestDefaultArgsMatchImage(t *testing.T) {
	if got := LlamacppArgs(LlamacppOptions{}); !slices.Equal(got, image.LlamacppServerArgs) {
		t.Fatalf("default args %q, image CMD %q", got, image.LlamacppServerArgs)
	}
	got := LlamacppArgs(LlamacppOptions{Ctx: 4096, Slots: 2, Threads: 2, ExtraArgs: []string{"--metrics"}})
	want := "llama-server -m /models/tiny-qwen3.gguf --jinja --no-prefill-assistant --host 0.0.0.0 --port 8080 -t 2 -c 4096 -np 2 --metrics"
	if strings.Join(got, " ") != want {
		t.Fatalf("args %q, want %q", strings.Join(got, " "), want)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []LlamacppOptions{
		{Ctx: -1}, {Slots: -2}, {HostPort: 70000}, {HostIP: "localhost:1"}, {Ctx: 1024, Slots: 8},
	} {
		if _, err := StartLlamacpp(context.Background(), nil, o); err == nil {
			t.Errorf("%+v: want an error", o)
		}
	}
}

func docker(t *testing.T) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and the Docker engine is unreachable: %v", err)
		}
		t.Skipf("Docker engine unreachable (set CI=true to fail instead): %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestMissingImage(t *testing.T) {
	cli := docker(t)
	_, err := StartLlamacpp(t.Context(), cli, LlamacppOptions{Image: "rollout-llamacpp:no-such-tag"})
	if !errors.Is(err, ErrImageMissing) || !strings.Contains(err.Error(), "rollout sandbox image build --name llamacpp") {
		t.Fatalf("err %v: want ErrImageMissing saying how to build it", err)
	}
}

// A server that exits at once is reported with its log, and its container
// is removed.
func TestServerExitsEarly(t *testing.T) {
	cli := docker(t)
	if _, err := cli.ImageInspect(t.Context(), image.Ref("llamacpp")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %s is missing: %v", image.Ref("llamacpp"), err)
		}
		t.Skipf("%s missing (rollout sandbox image build --name llamacpp): %v", image.Ref("llamacpp"), err)
	}
	_, err := StartLlamacpp(t.Context(), cli, LlamacppOptions{Model: "/models/absent.gguf", Owner: "test", ReadyTimeout: time.Minute})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "absent.gguf") {
		t.Fatalf("err %v: want ErrNotReady with the server's log naming the model", err)
	}
	res, lerr := cli.ContainerList(t.Context(), client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", LabelOwner+"=test:"+strconv.Itoa(os.Getpid()))})
	if lerr != nil {
		t.Fatal(lerr)
	}
	if len(res.Items) != 0 {
		t.Fatalf("%d containers left behind", len(res.Items))
	}
}
