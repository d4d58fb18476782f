package image

import "context"

// Paths and ports of the registry image.
const (
	// RegistryRef is a container registry (CNCF distribution v2, Debian's
	// docker-registry package): the Kubernetes lab's registry, which the
	// registry path of docs/kubernetes.md ("Images") is tested against.
	RegistryRef = "rollout-registry:bookworm"
	// RegistryPort is the port it listens on inside its container (plain
	// HTTP: it is published on the host's loopback only, which Docker
	// treats as an insecure registry by default).
	RegistryPort = 5000
)

// RegistryConfig is the registry's configuration in the image: Debian's
// without its htpasswd authentication (a lab registry on loopback and a
// private network; a real one is the user's): filesystem storage under
// /var/lib/docker-registry, plain HTTP on :5000.
const RegistryConfig = "/etc/docker/registry/rollout.yml"

// RegistryArgs is the image's default command.
var RegistryArgs = []string{"docker-registry", "serve", RegistryConfig}

var registryBookworm = &debootstrapRecipe{
	suite:    "bookworm",
	variant:  "minbase",
	packages: []string{"ca-certificates", "docker-registry"},
	dpkgOpts: []string{"force-unsafe-io"},
	aptOpts: []string{
		`Acquire::Languages "none"`,
		`APT::Install-Recommends "false"`,
	},
	customize: []string{
		`printf 'version: 0.1\nlog:\n  fields:\n    service: registry\nstorage:\n  cache:\n    blobdescriptor: inmemory\n  filesystem:\n    rootdirectory: /var/lib/docker-registry\n  delete:\n    enabled: true\nhttp:\n  addr: :5000\n  headers:\n    X-Content-Type-Options: [nosniff]\n' >` + RegistryConfig,
		// A smoke check at build time: the binary runs.
		"docker-registry --version",
	},
}

func init() {
	addRecipe(&recipe{
		name:   "registry",
		kind:   Lab,
		ref:    RegistryRef,
		doc:    "Debian 12 minbase + docker-registry (distribution v2): the Kubernetes lab's image registry (scripts/k8s-lab)",
		spec:   func(context.Context) (string, error) { return registryBookworm.spec() },
		rootfs: registryBookworm.rootfs,
		layer:  withShell(agentUser, "/bin/sh"),
		prune:  docsPrune,
		changes: []string{
			"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LABEL io.rollout.lab=registry",
			"EXPOSE 5000",
			`CMD ["docker-registry", "serve", "` + RegistryConfig + `"]`,
		},
	})
}
