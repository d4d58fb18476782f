package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rollout-rl/rollout/sandbox"
)

// createLease makes the owner of every pod of this process. The process
// renews it; a lease left unrenewed is deleted by any instance's reaper (or
// `rollout sandbox gc`), and Kubernetes' garbage collector then deletes
// its pods.
func (k *Kubernetes) createLease(ctx context.Context) error {
	d := int32(k8sLeaseDuration / time.Second)
	now := metav1.NewMicroTime(time.Now())
	holder := k.labels[sandbox.LabelHost] + "/" + k.labels[sandbox.LabelPID]
	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "rollout-" + k.opts.Instance, Labels: maps.Clone(k.labels)},
		Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, AcquireTime: &now, RenewTime: &now},
	}
	got, err := k.cs.coord.Leases(k.cfg.Namespace).Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsForbidden(err) {
			return fmt.Errorf("%w: create owner lease: %v (the service account needs leases create/update/delete, docs/kubernetes.md)", sandbox.ErrInvalid, err)
		}
		return fmt.Errorf("%w: create owner lease: %v", sandbox.ErrUnavailable, err)
	}
	k.lease = got
	return nil
}

func (k *Kubernetes) renewLease(ctx context.Context) {
	k.mu.Lock()
	l := k.lease.DeepCopy()
	k.mu.Unlock()
	now := metav1.NewMicroTime(time.Now())
	l.Spec.RenewTime = &now
	got, err := k.cs.coord.Leases(k.cfg.Namespace).Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		k.log.Warn("owner lease renewal failed", "err", err)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			if cur, gerr := k.cs.coord.Leases(k.cfg.Namespace).Get(ctx, l.Name, metav1.GetOptions{}); gerr == nil {
				k.mu.Lock()
				k.lease = cur
				k.mu.Unlock()
			}
		}
		return
	}
	k.mu.Lock()
	k.lease = got
	k.mu.Unlock()
}

func (k *Kubernetes) background(ctx context.Context) {
	renew := time.NewTicker(k8sLeaseDuration / 3)
	defer renew.Stop()
	capT := time.NewTicker(10 * time.Second)
	defer capT.Stop()
	reapEvery := k.opts.ReapInterval
	if reapEvery <= 0 {
		reapEvery = time.Hour
	}
	reap := time.NewTicker(reapEvery)
	defer reap.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			k.renewLease(rctx)
			cancel()
		case <-capT.C:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			k.refreshCapacity(rctx)
			cancel()
		case <-reap.C:
			if k.opts.ReapInterval > 0 {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				if _, err := k.Reap(rctx, sandbox.ReapOptions{}); err != nil {
					k.log.Warn("reap failed", "err", err)
				}
				cancel()
			}
			k.enforceLimits(ctx)
		}
	}
}
