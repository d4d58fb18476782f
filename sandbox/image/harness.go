package image

import (
	"context"
	"slices"
)

// harnessSid is Debian sid with the official OpenAI and Anthropic Python
// SDKs from Debian packages (no PyPI): the task image of harness envs,
// whose agent harness runs in the sandbox and calls its gateway session
// (docs/images.md). sid's Release file is short-lived and often expired on
// mirrors and snapshots, hence Check-Valid-Until false.
var harnessSid = &debootstrapRecipe{
	suite:     "sid",
	onlySuite: true,
	variant:   "minbase",
	packages: []string{
		"bash", "ca-certificates", "coreutils", "curl",
		"python3", "python3-openai", "python3-anthropic",
	},
	dpkgOpts: []string{"force-unsafe-io"},
	aptOpts: []string{
		`Acquire::Languages "none"`,
		`APT::Install-Recommends "false"`,
		`Acquire::Check-Valid-Until "false"`,
	},
	// Fails the build when the SDKs do not import.
	customize: []string{
		"PYTHONDONTWRITEBYTECODE=1 python3 -c 'import openai, anthropic'",
	},
}

func init() {
	addRecipe(&recipe{
		name:    "harness",
		kind:    Harness,
		ref:     "rollout-harness:sid",
		doc:     "Debian sid minbase + bash, coreutils, curl, python3, python3-openai, python3-anthropic (harness envs' task image)",
		spec:    func(context.Context) (string, error) { return harnessSid.spec() },
		rootfs:  harnessSid.rootfs,
		layer:   withShell(agentUser, "/bin/bash"),
		prune:   docsPrune,
		changes: append(slices.Clone(baseEnv), "WORKDIR /workspace", `CMD ["/bin/bash"]`),
	})
}
