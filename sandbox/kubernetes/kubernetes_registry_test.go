package kubernetes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/image"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

// The registry path (docs/kubernetes.md, "Images"): the sandbox and agent
// images are pushed to the lab's registry (ROLLOUT_K8S_LAB_REGISTRY, a
// loopback address of the host that the nodes' containerd maps to the
// registry container) and the nodes pull them from there: their names in
// the registry are not among the images loaded into the nodes.
func TestKubernetesRegistry(t *testing.T) {
	needKube(t) // the lab is up
	reg := os.Getenv("ROLLOUT_K8S_LAB_REGISTRY")
	if reg == "" {
		t.Skip("ROLLOUT_K8S_LAB_REGISTRY not set (scripts/k8s-lab/lab.sh env prints it)")
	}
	kc := os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG")
	ab := sandbox.AgentBinary{Path: filepath.Join(filepath.Dir(kc), "rollout-agent")}
	agentRef, err := k8sconfig.AgentImageRef(ab)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	for _, ref := range []string{labImage, agentRef} {
		pushed, err := image.Push(ctx, cli, reg, ref)
		if err != nil {
			t.Fatalf("push: %v", err)
		}
		t.Cleanup(func() { // the registry tag Push added to the local engine
			_, _ = cli.ImageRemove(context.Background(), pushed, client.ImageRemoveOptions{})
		})
		if pushed != reg+"/"+ref {
			t.Fatalf("pushed %s, want %s", pushed, reg+"/"+ref)
		}
	}

	for _, policy := range []string{"Always", "IfNotPresent"} {
		t.Run(policy, func(t *testing.T) {
			k, err := New(ctx, Options{
				Config:   k8sconfig.Config{Kubeconfig: kc, Namespace: "default", ImagePullPolicy: policy, ImageRegistry: reg},
				Instance: "kreg-" + sandbox.RandomID(4), Agent: &ab,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := k.Close(context.Background()); err != nil {
					t.Errorf("close: %v", err)
				}
			}()
			s := newKubeSandbox(t, k, sandbox.Spec{})
			r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo from-registry; id -u"})
			if err != nil || r.ExitCode != 0 || string(r.Stdout) != "from-registry\n1000\n" {
				t.Fatalf("exec: %+v %v", r, err)
			}
			pod, err := k.cs.core.Pods(k.Namespace()).Get(ctx, s.ID(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := pod.Spec.Containers[0].ImagePullPolicy; string(got) != policy {
				t.Errorf("sandbox container pull policy %s, want %s", got, policy)
			}
			statuses := append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...)
			if len(statuses) != 2 {
				t.Fatalf("%d container statuses", len(statuses))
			}
			for _, st := range statuses {
				// The node resolved the image in the registry: its
				// repo digest names it.
				if !strings.HasPrefix(st.Image, reg+"/") || !strings.HasPrefix(st.ImageID, reg+"/") {
					t.Errorf("container %s: image %s (%s), want one pulled from %s", st.Name, st.Image, st.ImageID, reg)
				}
			}
		})
	}

	// An image that was never pushed fails clearly, naming it.
	k, err := New(ctx, Options{
		Config:   k8sconfig.Config{Kubeconfig: kc, Namespace: "default", ImageRegistry: reg, StartTimeout: time.Minute},
		Instance: "kreg-" + sandbox.RandomID(4), Agent: &ab,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close(context.Background())
	_, err = k.Create(ctx, sandbox.Spec{Image: "rollout-never-pushed:1"})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), reg+"/rollout-never-pushed:1") {
		t.Fatalf("create with an image missing from the registry: %v", err)
	}
	t.Logf("missing image: %v", err)
}
