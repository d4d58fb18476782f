// Package k8sconfig is the Kubernetes backend's configuration block (the
// run config's sandbox.kubernetes): plain data and its validation, so the
// run config does not link client-go.
package k8sconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/rollout-rl/rollout/sandbox"
	"io"
	"os"
	"time"
)

// Kubernetes modes (KubernetesConfig.Mode).
const (
	// ModePods creates one plain Pod per sandbox: works on any cluster.
	ModePods = "pods"
	// ModeAgentSandbox asks the kubernetes-sigs/agent-sandbox controller
	// for pods: a SandboxTemplate and a SandboxWarmPool per sandbox spec, a
	// SandboxClaim per sandbox (sandbox/kubernetes/kubernetes_agentsandbox.go,
	// docs/kubernetes.md "Modes").
	ModeAgentSandbox = "agent-sandbox"
)

// KubernetesConfig is the typed `sandbox.kubernetes` block of a run config
// and the configuration of the Kubernetes backend (docs/kubernetes.md).
type Config struct {
	// Kubeconfig is a kubeconfig file; empty uses $KUBECONFIG, then
	// ~/.kube/config, then the in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig,omitempty" json:"kubeconfig,omitempty"`
	// Context selects a kubeconfig context (default: the current one).
	Context string `yaml:"context,omitempty" json:"context,omitempty"`
	// InCluster forces the in-cluster configuration (the rollout process
	// runs in a pod with a service account).
	InCluster bool `yaml:"in_cluster,omitempty" json:"in_cluster,omitempty"`
	// Namespace holds the sandbox pods; it must exist (default "default").
	Namespace string `yaml:"namespace,omitempty" json:"namespace,omitempty"`
	// Mode is "pods" (default) or "agent-sandbox" (needs the
	// kubernetes-sigs/agent-sandbox controller and its CRDs).
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`
	// AgentSandbox configures mode agent-sandbox.
	AgentSandbox AgentSandboxConfig `yaml:"agent_sandbox,omitempty" json:"agent_sandbox,omitempty"`
	// NodeSelector, Tolerations, RuntimeClassName (e.g. gvisor, kata) and
	// ServiceAccount are copied into every pod.
	NodeSelector     map[string]string `yaml:"node_selector,omitempty" json:"node_selector,omitempty"`
	Tolerations      []Toleration      `yaml:"tolerations,omitempty" json:"tolerations,omitempty"`
	RuntimeClassName string            `yaml:"runtime_class_name,omitempty" json:"runtime_class_name,omitempty"`
	ServiceAccount   string            `yaml:"service_account,omitempty" json:"service_account,omitempty"`
	// ImagePullPolicy of the sandbox and agent containers: IfNotPresent
	// (default), Never (images loaded into the nodes, the lab) or Always.
	ImagePullPolicy string `yaml:"image_pull_policy,omitempty" json:"image_pull_policy,omitempty"`
	// ImageRegistry, when set, prefixes image references that name no
	// registry (rollout-sandbox:bookworm → REGISTRY/rollout-sandbox:bookworm):
	// the images the user pushed there (`rollout sandbox image push`). Env
	// task images are built locally and pushed there by the job.
	ImageRegistry string `yaml:"image_registry,omitempty" json:"image_registry,omitempty"`
	// AgentImage holds the agent binary at /rollout-agent; default
	// rollout-agent:<first 12 hex of the binary's sha256> (AgentImageRef).
	AgentImage string `yaml:"agent_image,omitempty" json:"agent_image,omitempty"`
	// CPURequest (cores, default 0.01) and MemoryRequestMB (default 64,
	// at most the limit) are the pod's requests: what the scheduler and
	// admission count. The limits come from the sandbox spec.
	CPURequest      float64 `yaml:"cpu_request,omitempty" json:"cpu_request,omitempty"`
	MemoryRequestMB int64   `yaml:"memory_request_mb,omitempty" json:"memory_request_mb,omitempty"`
	// MaxPods bounds this process's pods, warm ones included (default 512);
	// admission also keeps to what the eligible nodes can hold.
	MaxPods int `yaml:"max_pods,omitempty" json:"max_pods,omitempty"`
	// MaxParallelCreates bounds creates in flight (default 32).
	MaxParallelCreates int `yaml:"max_parallel_creates,omitempty" json:"max_parallel_creates,omitempty"`
	// StartTimeout bounds create → agent hello (default 2m).
	StartTimeout time.Duration `yaml:"start_timeout,omitempty" json:"start_timeout,omitempty"`
	// NoNetworkPolicy skips the deny-all NetworkPolicy (clusters whose
	// users may not create one). Sandboxes with network "none" then rely
	// on the cluster's defaults: say so in your threat model.
	NoNetworkPolicy bool `yaml:"no_network_policy,omitempty" json:"no_network_policy,omitempty"`
}

// AgentSandboxConfig is the `sandbox.kubernetes.agent_sandbox` block.
type AgentSandboxConfig struct {
	// WarmPool is the replicas of the SandboxWarmPool kept per sandbox
	// spec (image, limits, env, network): pods the controller starts ahead
	// and a SandboxClaim adopts. 0 (default): every claim starts its pod
	// cold. They count against max_pods.
	WarmPool int `yaml:"warm_pool,omitempty" json:"warm_pool,omitempty"`
}

// Toleration is a pod toleration (core/v1 Toleration).
type Toleration struct {
	Key               string `yaml:"key,omitempty" json:"key,omitempty"`
	Operator          string `yaml:"operator,omitempty" json:"operator,omitempty"` // Equal (default) or Exists
	Value             string `yaml:"value,omitempty" json:"value,omitempty"`
	Effect            string `yaml:"effect,omitempty" json:"effect,omitempty"` // NoSchedule, PreferNoSchedule, NoExecute
	TolerationSeconds *int64 `yaml:"toleration_seconds,omitempty" json:"toleration_seconds,omitempty"`
}

// Validate checks the config and fills defaults.
func (c *Config) Validate() error {
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	switch c.Mode {
	case "":
		c.Mode = ModePods
	case ModePods, ModeAgentSandbox:
	default:
		return fmt.Errorf("sandbox.kubernetes.mode %q: want %q or %q", c.Mode, ModePods, ModeAgentSandbox)
	}
	switch c.ImagePullPolicy {
	case "":
		c.ImagePullPolicy = "IfNotPresent"
	case "IfNotPresent", "Never", "Always":
	default:
		return fmt.Errorf("sandbox.kubernetes.image_pull_policy %q: want IfNotPresent, Never or Always", c.ImagePullPolicy)
	}
	if c.CPURequest < 0 || c.MemoryRequestMB < 0 || c.MaxPods < 0 || c.MaxParallelCreates < 0 || c.StartTimeout < 0 {
		return errors.New("sandbox.kubernetes: negative cpu_request, memory_request_mb, max_pods, max_parallel_creates or start_timeout")
	}
	if c.AgentSandbox.WarmPool < 0 {
		return fmt.Errorf("sandbox.kubernetes.agent_sandbox.warm_pool %d: negative", c.AgentSandbox.WarmPool)
	}
	if c.AgentSandbox.WarmPool > 0 && c.Mode != ModeAgentSandbox {
		return fmt.Errorf("sandbox.kubernetes.agent_sandbox.warm_pool is set but mode is %q: it needs mode %q", c.Mode, ModeAgentSandbox)
	}
	if c.CPURequest == 0 {
		c.CPURequest = 0.01
	}
	if c.MemoryRequestMB == 0 {
		c.MemoryRequestMB = 64
	}
	if c.MaxPods == 0 {
		c.MaxPods = 512
	}
	if c.MaxParallelCreates == 0 {
		c.MaxParallelCreates = 32
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 2 * time.Minute
	}
	if c.AgentSandbox.WarmPool >= c.MaxPods {
		return fmt.Errorf("sandbox.kubernetes.agent_sandbox.warm_pool %d: must be below max_pods %d (warm pods count against it)", c.AgentSandbox.WarmPool, c.MaxPods)
	}
	for i, t := range c.Tolerations {
		switch t.Operator {
		case "", "Equal", "Exists":
		default:
			return fmt.Errorf("sandbox.kubernetes.tolerations[%d].operator %q: want Equal or Exists", i, t.Operator)
		}
		switch t.Effect {
		case "", "NoSchedule", "PreferNoSchedule", "NoExecute":
		default:
			return fmt.Errorf("sandbox.kubernetes.tolerations[%d].effect %q: want NoSchedule, PreferNoSchedule or NoExecute", i, t.Effect)
		}
	}
	return nil
}

// AgentImageRef is the default agent image for an agent binary:
// rollout-agent:<first 12 hex of its sha256>. The lab (scripts/k8s-lab
// lab.sh images) builds an image of this name (a FROM scratch image holding
// the binary at /rollout-agent) and loads it into the nodes; with a
// registry, push that image there.
func AgentImageRef(ab sandbox.AgentBinary) (string, error) {
	f, err := os.Open(ab.Path)
	if err != nil {
		return "", fmt.Errorf("agent image: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("agent image: %w", err)
	}
	return "rollout-agent:" + hex.EncodeToString(h.Sum(nil))[:12], nil
}
