package kubernetes

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/rollout-rl/rollout/sandbox"
)

func (k *Kubernetes) startInformer(ctx context.Context) {
	sel := sandbox.LabelInstance + "=" + k.opts.Instance
	// One informer on this instance's pods (not an informer factory: it
	// would link every API group's informers into the binary).
	lw := cache.NewFilteredListWatchFromClient(k.cs.core.RESTClient(), "pods", k.cfg.Namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = sel })
	k.informer = cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	notify := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			if t, ok2 := obj.(cache.DeletedFinalStateUnknown); ok2 {
				pod, _ = t.Obj.(*corev1.Pod)
			}
		}
		if pod == nil {
			return
		}
		k.podChanged(pod.Name, pod)
	}
	_, _ = k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, obj any) { notify(obj) },
		DeleteFunc: func(obj any) {
			pod, _ := obj.(*corev1.Pod)
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				pod, _ = t.Obj.(*corev1.Pod)
			}
			if pod != nil {
				k.podChanged(pod.Name, nil)
			}
		},
	})
	k.informed = make(chan struct{})
	go func() {
		defer close(k.informed)
		k.informer.RunWithContext(ctx)
	}()
}

// podChanged wakes a create waiting for the pod and breaks the channel of
// a live sandbox whose pod failed, lost its node or was deleted.
func (k *Kubernetes) podChanged(name string, pod *corev1.Pod) {
	if k.crd != nil {
		k.crd.podChanged(name, pod) // channels into warm pods
	}
	k.mu.Lock()
	w := k.waiters[name]
	s := k.live[name]
	k.mu.Unlock()
	if w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	if s == nil || s.Closing.Load() {
		return
	}
	if why := s.podLost(pod); why != "" {
		s.fail(why)
	}
}

// podLost says why a started sandbox pod can no longer serve, or "". A
// pod that was Ready and is no longer (the node lifecycle controller marks
// the pods of a node that stopped reporting NotReady) counts as lost.
func (s *k8sSandbox) podLost(pod *corev1.Pod) string {
	if why := podLost(pod); why != "" {
		return why
	}
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			s.seenReady.Store(true)
		} else if s.seenReady.Load() {
			why := fmt.Sprintf("pod no longer ready on node %s (node lost or container stopped)", pod.Spec.NodeName)
			if r := strings.TrimSpace(c.Reason + " " + c.Message); r != "" {
				why += ": " + r
			}
			return why
		}
	}
	return ""
}

// podLost says why a started sandbox pod can no longer serve, or "".
func podLost(pod *corev1.Pod) string {
	if pod == nil {
		return "pod was deleted"
	}
	if pod.DeletionTimestamp != nil {
		return "pod is being deleted"
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return podFailure(pod)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Terminated != nil {
			return podFailure(pod)
		}
	}
	return ""
}

// podFailure describes a finished pod: evicted, OOM-killed, deadline, exit.
func podFailure(pod *corev1.Pod) string {
	parts := []string{"pod " + strings.ToLower(string(pod.Status.Phase))}
	if pod.Status.Reason != "" {
		parts = append(parts, "reason "+pod.Status.Reason) // Evicted, DeadlineExceeded, NodeLost
	}
	if pod.Status.Message != "" {
		parts = append(parts, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			s := fmt.Sprintf("container %s exited %d", cs.Name, t.ExitCode)
			if t.Reason != "" {
				s += " (" + t.Reason + ")" // OOMKilled, Error
			}
			parts = append(parts, s)
		}
	}
	if pod.Spec.NodeName != "" {
		parts = append(parts, "node "+pod.Spec.NodeName)
	}
	return strings.Join(parts, ", ")
}
