package kubernetes

import (
	"fmt"
	"os"

	coordv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	netv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/rest"

	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig resolves the client configuration: InCluster, else the
// kubeconfig (explicit, $KUBECONFIG, ~/.kube/config), else in-cluster.
func RESTConfig(c *k8sconfig.Config) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if c.InCluster {
		cfg, err = rest.InClusterConfig()
	} else {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if c.Kubeconfig != "" {
			rules.ExplicitPath = c.Kubeconfig
		}
		overrides := &clientcmd.ConfigOverrides{CurrentContext: c.Context}
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
		if err != nil && c.Kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
			cfg, err = rest.InClusterConfig()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	// Every sandbox makes a few calls; client-go's default 5 QPS would
	// serialise a group's creates.
	cfg.QPS, cfg.Burst = 200, 400
	return cfg, nil
}

// kubeClients are the three API groups the backend uses. Not the whole
// clientset: it would link every group's client into the binary.
type kubeClients struct {
	core  corev1client.CoreV1Interface
	coord coordv1client.CoordinationV1Interface
	net   netv1client.NetworkingV1Interface
}

func newKubeClients(rc *rest.Config) (*kubeClients, error) {
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	coord, err := coordv1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	net, err := netv1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &kubeClients{core: core, coord: coord, net: net}, nil
}
