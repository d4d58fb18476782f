package image

import "context"

// K8sNodeRef is the image of the Kubernetes lab's nodes (docs/kubernetes.md):
// Debian's containerd, runc, CNI plugins and etcd. The Kubernetes binaries
// themselves are built from the Go module proxy by scripts/k8s-lab and
// mounted into the node containers, so the image does not depend on the
// Kubernetes version.
const K8sNodeRef = "rollout-k8s-node:bookworm"

var k8sNodeBookworm = &debootstrapRecipe{
	suite:   "bookworm",
	variant: "minbase",
	packages: []string{
		"ca-certificates", "containerd", "runc", "containernetworking-plugins", "etcd-server",
		"iptables", "iproute2", "procps", "kmod", "mount", "util-linux",
	},
	dpkgOpts: []string{"force-unsafe-io"},
	aptOpts: []string{
		`Acquire::Languages "none"`,
		`APT::Install-Recommends "false"`,
	},
}

func init() {
	addRecipe(&recipe{
		name:   "k8s-node",
		kind:   Lab,
		ref:    K8sNodeRef,
		doc:    "Debian 12 minbase + containerd, runc, CNI plugins, etcd: a node of the Kubernetes lab (scripts/k8s-lab)",
		spec:   func(context.Context) (string, error) { return k8sNodeBookworm.spec() },
		rootfs: k8sNodeBookworm.rootfs,
		layer:  withShell(agentUser, "/bin/sh"),
		prune:  docsPrune,
		changes: []string{
			"ENV PATH=/opt/k8s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LABEL io.rollout.lab=k8s-node",
			`CMD ["/bin/sh"]`,
		},
	})
}
