package kubernetes

import (
	"context"
	"fmt"

	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rollout-rl/rollout/sandbox"
)

func (k *Kubernetes) ensureNetworkPolicy(ctx context.Context) error {
	np := &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: NetworkPolicyName, Labels: map[string]string{sandbox.LabelManaged: "true"}},
		Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{sandbox.LabelManaged: "true", LabelNetwork: sandbox.NetworkNone}},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress},
		},
	}
	_, err := k.cs.net.NetworkPolicies(k.cfg.Namespace).Create(ctx, np, metav1.CreateOptions{})
	if err == nil || apierrors.IsAlreadyExists(err) {
		return nil
	}
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w: create NetworkPolicy %s in %s: %v (grant networkpolicies create, or set sandbox.kubernetes.no_network_policy)", sandbox.ErrInvalid, NetworkPolicyName, k.cfg.Namespace, err)
	}
	return fmt.Errorf("%w: create NetworkPolicy: %v", sandbox.ErrUnavailable, err)
}
