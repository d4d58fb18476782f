package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

// enforceLimits closes sandboxes past their idle timeout or lifetime.
func (k *Kubernetes) enforceLimits(ctx context.Context) {
	now := time.Now()
	var expired []*k8sSandbox
	var reasons []string
	k.mu.Lock()
	for _, s := range k.live {
		l := s.spec.Limits
		switch {
		case l.MaxLifetime > 0 && now.Sub(s.created) > l.MaxLifetime:
			expired, reasons = append(expired, s), append(reasons, "lifetime")
		case l.IdleTimeout > 0 && !s.Pooled.Load() && now.Sub(time.Unix(0, s.LastUsed.Load())) > l.IdleTimeout:
			expired, reasons = append(expired, s), append(reasons, "idle")
		}
	}
	k.mu.Unlock()
	for i, s := range expired {
		s.Reason.Store("closed by the reaper: " + reasons[i] + " limit")
		sandbox.MetricReaped.WithLabelValues(reasons[i]).Inc()
		_ = s.Close(ctx)
	}
}

// Reap deletes the owner leases of dead processes (not renewed for three
// lease durations; the garbage collector then deletes their pods) and, with
// opts.All, every pod and lease of this service in the namespace. It also
// deletes pods of this process it does not track (a create whose answer was
// lost) once older than a minute.
func (k *Kubernetes) Reap(ctx context.Context, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	k.mu.Lock()
	tracked := map[string]bool{}
	for n := range k.live {
		tracked[n] = true
	}
	for n := range k.waiters {
		tracked[n] = true
	}
	k.mu.Unlock()
	out, err := reapKubernetes(ctx, k.cs, k.cfg.Namespace, k.opts.Instance, tracked, opts)
	if k.crd != nil && err == nil {
		var more []sandbox.Reaped
		more, err = k.crd.reapLeaked(ctx)
		out = append(out, more...)
	}
	return out, err
}

// GC is `rollout sandbox gc` for a cluster: a fresh client, the
// same rules as Reap, no process of its own.
func GC(ctx context.Context, cfg k8sconfig.Config, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	rc, err := RESTConfig(&cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	cs, err := newKubeClients(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	return reapKubernetes(ctx, cs, cfg.Namespace, "", nil, opts)
}

func reapKubernetes(ctx context.Context, cs *kubeClients, ns, self string, tracked map[string]bool, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	sel := sandbox.LabelManaged + "=true"
	leases, err := cs.coord.Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("%w: list leases: %v", sandbox.ErrUnavailable, err)
	}
	var out []sandbox.Reaped
	alive := map[string]bool{}
	bg := metav1.DeletePropagationBackground
	for _, l := range leases.Items {
		inst := l.Labels[sandbox.LabelInstance]
		expired := true
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
			d := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
			expired = time.Since(l.Spec.RenewTime.Time) > 3*d
		}
		if inst == self || (!expired && !opts.All) {
			alive[inst] = true
			continue
		}
		err := cs.coord.Leases(ns).Delete(ctx, l.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		if err != nil && !apierrors.IsNotFound(err) {
			return out, fmt.Errorf("%w: delete lease %s: %v", sandbox.ErrUnavailable, l.Name, err)
		}
		sandbox.MetricReaped.WithLabelValues("orphan").Inc()
		out = append(out, sandbox.Reaped{ID: string(l.UID), Name: "lease/" + l.Name, Instance: inst, Reason: "orphan"})
	}
	// Pods whose owner is gone (the garbage collector does this too, but a
	// pod created without an owner, or with --all, is deleted here).
	pods, err := cs.core.Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return out, fmt.Errorf("%w: list pods: %v", sandbox.ErrUnavailable, err)
	}
	grace := int64(0)
	for _, p := range pods.Items {
		inst := p.Labels[sandbox.LabelInstance]
		reason := ""
		switch {
		case ownedByAgentSandbox(&p):
			// The agent-sandbox controller's pod goes with its claim or
			// warm pool, which the lease owns.
		case inst == self && self != "":
			if !tracked[p.Name] && time.Since(p.CreationTimestamp.Time) > time.Minute {
				reason = "leaked"
			}
		case opts.All:
			reason = "all"
		case !alive[inst]:
			reason = "orphan"
		}
		if reason == "" {
			continue
		}
		err := cs.core.Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		if err != nil && !apierrors.IsNotFound(err) {
			return out, fmt.Errorf("%w: delete pod %s: %v", sandbox.ErrUnavailable, p.Name, err)
		}
		sandbox.MetricReaped.WithLabelValues(reason).Inc()
		out = append(out, sandbox.Reaped{ID: string(p.UID), Name: "pod/" + p.Name, Instance: inst, Reason: reason})
	}
	return out, nil
}

// labelValue makes s a valid label value (hostnames usually are).
func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	out := strings.Trim(string(b), "-_.")
	if len(out) > 63 {
		out = strings.Trim(out[:63], "-_.")
	}
	return out
}
