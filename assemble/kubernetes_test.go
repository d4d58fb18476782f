package assemble

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/image"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

// With the Kubernetes backend a task image needs a registry to reach the
// nodes: without sandbox.kubernetes.image_registry the build is refused
// with a clear error before any engine or cluster is contacted.
func TestKubernetesTaskImageNeedsRegistry(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ registry, want string }{
		{"", "image_registry, which is not set"},
		{"http://reg.example:5000", "without a scheme"},
	} {
		l := &lazyBackend{kube: &k8sconfig.Config{ImageRegistry: tc.registry}}
		ti := &taskImages{backend: l}
		_, err := ti.BuildTask(ctx, envs.ImageBuild{Dir: t.TempDir()})
		if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("registry %q: %v, want ErrInvalid containing %q", tc.registry, err, tc.want)
		}
		if l.k != nil || l.daemon != nil {
			t.Errorf("registry %q: a backend or engine was started", tc.registry)
		}
	}
}

// TestKubernetesTaskImagePushed runs an env's task image (envs.ImageBuild)
// on the lab cluster: built by the local engine, pushed to the lab's
// registry (sandbox.kubernetes.image_registry), pulled by the node.
func TestKubernetesTaskImagePushed(t *testing.T) {
	kc, reg := os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG"), os.Getenv("ROLLOUT_K8S_LAB_REGISTRY")
	if kc == "" || reg == "" {
		t.Skip("ROLLOUT_K8S_LAB_KUBECONFIG or ROLLOUT_K8S_LAB_REGISTRY not set (start the lab: scripts/k8s-lab/lab.sh up)")
	}
	agent := filepath.Join(filepath.Dir(kc), "rollout-agent")
	t.Setenv("ROLLOUT_AGENT", agent)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The agent image goes to the registry too (image_registry names
	// every image the pods use).
	agentRef, err := k8sconfig.AgentImageRef(sandbox.AgentBinary{Path: agent})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := dockerclient.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	if _, err := image.Push(ctx, cli, reg, agentRef); err != nil {
		t.Fatal(err)
	}

	// A context unique to this run, so the image is built and pushed now.
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	marker := "task-" + hex.EncodeToString(b)
	dir := t.TempDir()
	df := "FROM rollout-sandbox:busybox\nRUN echo " + marker + " > /task-marker\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
		t.Fatal(err)
	}
	l := &lazyBackend{log: slog.New(slog.DiscardHandler), instance: "jobtest-" + hex.EncodeToString(b[:3]), kube: &k8sconfig.Config{
		Kubeconfig: kc, Namespace: "default", ImagePullPolicy: "IfNotPresent", ImageRegistry: reg}}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		if err := l.Close(cctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	ti := &taskImages{backend: l}
	ref, err := ti.BuildTask(ctx, envs.ImageBuild{Dir: dir})
	if err != nil {
		t.Fatalf("build and push the task image: %v", err)
	}
	if !strings.HasPrefix(ref, image.TaskRepository+":") {
		t.Fatalf("task image %s", ref)
	}
	t.Cleanup(func() { // this run's image and its registry tag
		for _, r := range []string{reg + "/" + ref, ref} {
			_, _ = cli.ImageRemove(context.Background(), r, client.ImageRemoveOptions{})
		}
	})
	s, err := l.Create(ctx, sandbox.Spec{Image: ref})
	if err != nil {
		t.Fatalf("sandbox from the pushed task image: %v", err)
	}
	defer s.Close(context.Background())
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "cat /task-marker"})
	if err != nil || r.ExitCode != 0 || strings.TrimSpace(string(r.Stdout)) != marker {
		t.Fatalf("exec in the task image's pod: %+v %v", r, err)
	}
}
