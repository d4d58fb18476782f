package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"math"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/rollout-rl/rollout/internal/util/imageref"
	"github.com/rollout-rl/rollout/sandbox"
)

// createPod creates the pod; a namespace quota that is full is waited out
// (admission by quota) rather than failed.
func (k *Kubernetes) createPod(ctx context.Context, pod *corev1.Pod) error {
	back := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		t := time.Now()
		_, err := k.cs.core.Pods(k.cfg.Namespace).Create(cctx, pod, metav1.CreateOptions{})
		sandbox.MetricDaemon.WithLabelValues("pod_create").Observe(time.Since(t).Seconds())
		cancel()
		switch {
		case err == nil:
			return nil
		case apierrors.IsAlreadyExists(err) && attempt > 0:
			return nil // an earlier attempt reached the API server
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
			k.log.Debug("namespace quota full, waiting", "err", err)
		case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
			return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		case apierrors.IsForbidden(err):
			return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		case apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || isConnErr(err):
			if attempt >= 3 {
				return fmt.Errorf("%w: create pod: %v", sandbox.ErrUnavailable, err)
			}
		default:
			return fmt.Errorf("%w: create pod: %v", sandbox.ErrUnavailable, err)
		}
		select {
		case <-time.After(back):
		case <-ctx.Done():
			return ctx.Err()
		}
		back = min(2*back, 2*time.Second)
	}
}

func isConnErr(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connection refused") || strings.Contains(s, "connection reset") ||
		strings.Contains(s, "EOF") || strings.Contains(s, "i/o timeout")
}

// waitRunning waits until the sandbox container runs, turning the pod's
// waiting reasons into classified errors.
func (k *Kubernetes) waitRunning(ctx context.Context, name string, wake <-chan struct{}) (*corev1.Pod, error) {
	deadline := time.NewTimer(k.cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Second) // informer events are the fast path
	defer tick.Stop()
	key := k.cfg.Namespace + "/" + name
	var last string
	for {
		if obj, ok, _ := k.informer.GetStore().GetByKey(key); ok {
			pod := obj.(*corev1.Pod)
			done, err := podStarting(pod)
			if err != nil || done {
				return pod, err
			}
			last = describeWaiting(pod)
		}
		select {
		case <-wake:
		case <-tick.C:
			// A pod bound to a node that stopped reporting would wait out
			// the whole start timeout: give up as soon as the node is not
			// Ready.
			if obj, ok, _ := k.informer.GetStore().GetByKey(key); ok {
				if node := obj.(*corev1.Pod).Spec.NodeName; node != "" {
					if n, err := k.cs.core.Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil && !nodeReady(n) {
						return nil, fmt.Errorf("%w: node %s of the starting pod is not ready (%s)", sandbox.ErrUnavailable, node, last)
					}
				}
			}
		case <-deadline.C:
			return nil, fmt.Errorf("%w: pod not running after %s (%s)", sandbox.ErrUnavailable, k.cfg.StartTimeout, last)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// podStarting reports whether the sandbox container runs, or why it never
// will.
func podStarting(pod *corev1.Pod) (bool, error) {
	if pod.DeletionTimestamp != nil {
		return false, fmt.Errorf("%w: pod deleted while starting", sandbox.ErrUnavailable)
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return false, fmt.Errorf("%w: %s", sandbox.ErrUnavailable, podFailure(pod))
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			if w := cs.State.Waiting; w != nil {
				switch w.Reason {
				case "ErrImageNeverPull", "InvalidImageName":
					return false, fmt.Errorf("%w: image %s of container %s: %s: %s (load it into the nodes or push it to a registry, docs/kubernetes.md)", sandbox.ErrInvalid, cs.Image, cs.Name, w.Reason, w.Message)
				case "ErrImagePull", "ImagePullBackOff":
					return false, fmt.Errorf("%w: image %s of container %s: %s: %s", sandbox.ErrInvalid, cs.Image, cs.Name, w.Reason, w.Message)
				case "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff":
					return false, fmt.Errorf("%w: container %s: %s: %s", sandbox.ErrUnavailable, cs.Name, w.Reason, w.Message)
				}
			}
			if t := cs.State.Terminated; t != nil && (t.ExitCode != 0 || cs.Name == ContainerName) {
				return false, fmt.Errorf("%w: container %s exited %d (%s) while starting: %s", sandbox.ErrUnavailable, cs.Name, t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
			}
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Running != nil {
			return true, nil
		}
	}
	return false, nil
}

func describeWaiting(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "unschedulable: " + c.Message
		}
	}
	for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			return cs.Name + " waiting: " + w.Reason
		}
	}
	return "phase " + string(pod.Status.Phase)
}

// podFor builds the pod of a sandbox (docs/kubernetes.md, "Isolation").
func (k *Kubernetes) podFor(spec sandbox.Spec, extra map[string]string) *corev1.Pod {
	labels, annotations := k.podLabels(spec, extra)
	agentPath := k8sAgentDir + "/agent"
	args := append([]string(nil), k.agent.Args...)
	installRes, sandboxRes := k.podResources(spec)
	f := false
	grace := int64(0)
	volumes, mounts := podVolumes(spec)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "rollout-" + k.opts.Instance + "-" + sandbox.RandomID(6),
			Namespace:   k.cfg.Namespace,
			Labels:      labels,
			Annotations: annotations,
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			TerminationGracePeriodSeconds: &grace,
			ServiceAccountName:            k.cfg.ServiceAccount,
			NodeSelector:                  k.cfg.NodeSelector,
			SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Volumes:                       volumes,
			InitContainers: []corev1.Container{{
				Name:            "install-agent",
				Image:           k.agentI,
				ImagePullPolicy: corev1.PullPolicy(k.cfg.ImagePullPolicy),
				Command:         append(append([]string{"/rollout-agent"}, args...), "-install", agentPath),
				VolumeMounts:    []corev1.VolumeMount{{Name: "rollout-agent", MountPath: k8sAgentDir}},
				SecurityContext: installerSecurity(),
				Resources:       installRes,
			}},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           imageref.InRegistry(k.cfg.ImageRegistry, spec.Image),
				ImagePullPolicy: corev1.PullPolicy(k.cfg.ImagePullPolicy),
				// The pod's main process only reaps orphans; the agent that
				// serves the channel is exec'd (Kubernetes.connect).
				Command:         append(append([]string{agentPath}, args...), "-init"),
				WorkingDir:      "/",
				Env:             podEnv(spec),
				VolumeMounts:    mounts,
				SecurityContext: sandboxSecurity(spec),
				Resources:       sandboxRes,
			}},
		},
	}
	k.placePod(pod, spec)
	return pod
}

// podLabels are the pod's labels and annotations: every caller label is
// an annotation, and a label too when Kubernetes accepts it as one; the
// backend's own labels, extra and the network policy (which the network
// policies select on) are labels.
func (k *Kubernetes) podLabels(spec sandbox.Spec, extra map[string]string) (labels, annotations map[string]string) {
	labels = maps.Clone(k.labels)
	annotations = map[string]string{}
	for key, v := range spec.Labels {
		annotations[key] = v
		if len(validation.IsQualifiedName(key)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			labels[key] = v
		}
	}
	maps.Copy(labels, extra)
	labels[LabelNetwork] = spec.Network
	return labels, annotations
}

// podEnv is spec's environment, sorted so equal specs give equal pods.
func podEnv(spec sandbox.Spec) []corev1.EnvVar {
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	for key, v := range spec.Env {
		env = append(env, corev1.EnvVar{Name: key, Value: v})
	}
	sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	return env
}

// podResources are the installer's and the sandbox container's limits and
// requests. Both are limited to the sandbox's CPU and memory; the sandbox
// container's ephemeral storage is its disk bound plus 64 MiB for the
// agent's own files, and the requests are the configured ones capped by
// the limits.
func (k *Kubernetes) podResources(spec sandbox.Spec) (install, sandboxRes corev1.ResourceRequirements) {
	cpu := resource.NewMilliQuantity(int64(math.Ceil(spec.Limits.CPUs*1000)), resource.DecimalSI)
	mem := resource.NewQuantity(spec.Limits.MemoryBytes, resource.BinarySI)
	disk := resource.NewQuantity(spec.Limits.DiskBytes+64<<20, resource.BinarySI)
	cpuReq := resource.NewMilliQuantity(int64(math.Ceil(min(k.cfg.CPURequest, spec.Limits.CPUs)*1000)), resource.DecimalSI)
	memReq := resource.NewQuantity(min(k.cfg.MemoryRequestMB<<20, spec.Limits.MemoryBytes), resource.BinarySI)
	install = corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *mem},
		Requests: corev1.ResourceList{corev1.ResourceCPU: *cpuReq, corev1.ResourceMemory: *memReq},
	}
	sandboxRes = corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *mem,
			corev1.ResourceEphemeralStorage: *disk},
		Requests: corev1.ResourceList{corev1.ResourceCPU: *cpuReq, corev1.ResourceMemory: *memReq},
	}
	return install, sandboxRes
}

// podVolumes are the pod's volumes and the sandbox container's mounts: the
// agent's directory (written by the installer, read-only here) and, with a
// read-only root, a bounded /tmp and workdir.
func podVolumes(spec sandbox.Spec) ([]corev1.Volume, []corev1.VolumeMount) {
	volumes := []corev1.Volume{{Name: "rollout-agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(128<<20, resource.BinarySI)}}}}
	mounts := []corev1.VolumeMount{{Name: "rollout-agent", MountPath: k8sAgentDir, ReadOnly: true}}
	if spec.Limits.ReadOnlyRoot {
		volumes = append(volumes,
			corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(min(spec.Limits.DiskBytes, 512<<20), resource.BinarySI)}}},
			corev1.Volume{Name: "workdir", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(spec.Limits.DiskBytes, resource.BinarySI)}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"}, corev1.VolumeMount{Name: "workdir", MountPath: spec.Workdir})
	}
	return volumes, mounts
}

// installerSecurity runs the agent installer as nobody with nothing it
// does not need: it only copies the agent into its volume.
func installerSecurity() *corev1.SecurityContext {
	f, t := false, true
	nobody := int64(65534)
	return &corev1.SecurityContext{
		RunAsUser: &nobody, RunAsNonRoot: &t, AllowPrivilegeEscalation: &f, ReadOnlyRootFilesystem: &t,
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// sandboxSecurity is the sandbox container's: a root agent with four
// capabilities, no escalation, the runtime's default seccomp profile.
func sandboxSecurity(spec sandbox.Spec) *corev1.SecurityContext {
	f := false
	var root int64
	readOnly := spec.Limits.ReadOnlyRoot
	return &corev1.SecurityContext{
		// Only the root agent holds these four: it switches to the sandbox
		// user (SETUID/SETGID), prepares the workdir (CHOWN) and kills that
		// user's process groups (KILL). Commands run with none.
		RunAsUser:                &root,
		RunAsNonRoot:             &f,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"CHOWN", "SETUID", "SETGID", "KILL"}},
		AllowPrivilegeEscalation: &f,
		ReadOnlyRootFilesystem:   &readOnly,
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// placePod sets where and how long the pod may run: the runtime class,
// the tolerations, a deadline past the sandbox's lifetime, and the
// backend's lease as owner (the pod goes when the lease does).
func (k *Kubernetes) placePod(pod *corev1.Pod, spec sandbox.Spec) {
	if k.cfg.RuntimeClassName != "" {
		rc := k.cfg.RuntimeClassName
		pod.Spec.RuntimeClassName = &rc
	}
	for _, tl := range k.cfg.Tolerations {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{Key: tl.Key, Operator: corev1.TolerationOperator(tl.Operator),
			Value: tl.Value, Effect: corev1.TaintEffect(tl.Effect), TolerationSeconds: tl.TolerationSeconds})
	}
	if spec.Limits.MaxLifetime > 0 {
		// The kubelet ends the pod even when no rollout process is left.
		secs := int64(math.Ceil(spec.Limits.MaxLifetime.Seconds())) + 60
		pod.Spec.ActiveDeadlineSeconds = &secs
	}
	k.mu.Lock()
	if k.lease != nil {
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Name: k.lease.Name, UID: k.lease.UID}}
	}
	k.mu.Unlock()
}

// agentArgs are the exec'd agent's arguments for spec.
func (k *Kubernetes) agentArgs(spec sandbox.Spec) []string {
	user, optional := spec.User, false
	if user == "" {
		user, optional = "agent", true
	}
	cmd := append(append([]string{k8sAgentDir + "/agent"}, k.agent.Args...), "-user", user, "-workdir", spec.Workdir)
	if optional {
		// Without the image's metadata the fallback is the container's
		// user, root (as the Docker backend for images without USER).
		cmd = append(cmd, "-optional-user", "-fallback-user", "0")
	}
	return cmd
}

// remove deletes a sandbox's pod, in mode agent-sandbox its claim first.
func (k *Kubernetes) remove(ctx context.Context, pod string, ref *claimRef) error {
	if ref != nil && k.crd != nil {
		return k.crd.Release(ctx, *ref, pod)
	}
	return k.deletePod(ctx, pod)
}

// deletePod deletes a pod at once (grace period 0), also after ctx was
// cancelled, also on a lost node (the API object goes away immediately).
func (k *Kubernetes) deletePod(ctx context.Context, name string) error {
	grace := int64(0)
	var err error
	for attempt := range 4 {
		if attempt > 0 {
			time.Sleep(time.Duration(200<<attempt) * time.Millisecond)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		t := time.Now()
		err = k.cs.core.Pods(k.cfg.Namespace).Delete(cctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		sandbox.MetricDaemon.WithLabelValues("pod_delete").Observe(time.Since(t).Seconds())
		cancel()
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !(apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || isConnErr(err)) {
			break
		}
	}
	sandbox.MetricFailures.WithLabelValues("remove").Inc()
	return fmt.Errorf("delete pod %s: %w: %v", name, sandbox.ErrUnavailable, err)
}
