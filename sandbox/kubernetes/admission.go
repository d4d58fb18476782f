package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rollout-rl/rollout/sandbox"
)

// Capacity is the number of pods admission currently allows at once:
// min(MaxPods, what the eligible Ready nodes can hold).
func (k *Kubernetes) Capacity() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.limitLocked()
}

// refreshCapacity recomputes how many sandbox pods the eligible nodes can
// hold: for each Ready, schedulable node matching the node selector,
// min(allocatable pods, allocatable cpu / cpu request, allocatable memory /
// memory request), minus the pods of other owners already there.
func (k *Kubernetes) refreshCapacity(ctx context.Context) {
	nodes, err := k.cs.core.Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		if !apierrors.IsForbidden(err) {
			k.log.Debug("list nodes for admission failed", "err", err)
		}
		return // keep the last estimate; MaxPods still applies
	}
	cpuReq := k.cfg.CPURequest
	memReq := float64(k.cfg.MemoryRequestMB << 20)
	total := 0
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Spec.Unschedulable || !nodeReady(n) || !matches(n.Labels, k.cfg.NodeSelector) {
			continue
		}
		a := n.Status.Allocatable
		c := a.Pods().Value()
		if cpu := a.Cpu().AsApproximateFloat64() / cpuReq; cpu < float64(c) {
			c = int64(cpu)
		}
		if mem := a.Memory().AsApproximateFloat64() / memReq; mem < float64(c) {
			c = int64(mem)
		}
		total += int(c)
	}
	// Pods of other owners on those nodes take room too.
	if pods, err := k.cs.core.Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Running"}); err == nil {
		for i := range pods.Items {
			if pods.Items[i].Labels[sandbox.LabelInstance] != k.opts.Instance {
				total--
			}
		}
	}
	k.mu.Lock()
	k.capacity = max(total, 1)
	k.cond.Broadcast()
	k.mu.Unlock()
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func matches(labels, sel map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (k *Kubernetes) limitLocked() int {
	l := k.cfg.MaxPods
	if k.capacity > 0 {
		l = min(k.cfg.MaxPods, k.capacity)
	}
	if k.crd != nil { // the server-side warm pools' pods
		l = max(l-int(k.crd.warm.Load()), 1)
	}
	return l
}

// admit takes a pod slot: it waits while this process's pods (live and
// being created) fill what the nodes can hold, so pods are not created to
// wait in Pending. block=false fails at once (pool fillers).
func (k *Kubernetes) admit(ctx context.Context, block bool) error {
	stop := context.AfterFunc(ctx, func() {
		k.mu.Lock()
		k.cond.Broadcast()
		k.mu.Unlock()
	})
	defer stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		if k.closed {
			return fmt.Errorf("%w: backend closed", sandbox.ErrClosed)
		}
		if len(k.live)+k.pending < k.limitLocked() {
			k.pending++
			return nil
		}
		if !block {
			return fmt.Errorf("%w: all %d pod slots in use", sandbox.ErrUnavailable, k.limitLocked())
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for a free pod slot (%d in use): %w", len(k.live)+k.pending, err)
		}
		k.cond.Wait()
	}
}
