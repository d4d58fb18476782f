package image

import (
	"context"
	"embed"
	"io/fs"
	"slices"
	"strings"
)

// The tiny model's generator, its config, the corpus its BPE merges are
// learned from and its chat template (docs/real-engines.md). They are part
// of the llamacpp recipe's hash: editing any of them rebuilds the image.
//
//go:embed tinyqwen3/make_tiny_gguf.py tinyqwen3/tiny-qwen3.json tinyqwen3/corpus.txt tinyqwen3/chat_template.jinja
var tinyQwen3Files embed.FS

// Paths inside the llamacpp engine image.
const (
	// LlamacppModel is the tiny random-weight Qwen3-architecture GGUF
	// baked into rollout-llamacpp:sid.
	LlamacppModel = "/models/tiny-qwen3.gguf"
	// LlamacppModelSidecar describes it: config, seed, derived vocabulary
	// facts, tensor names and shapes, the GGUF's sha256.
	LlamacppModelSidecar = "/models/tiny-qwen3.json"
	// LlamacppGenerator is where the generator and its inputs are kept in
	// the image, to regenerate or dump the weights.
	LlamacppGenerator = "/usr/share/rollout/tinyqwen3"
	// LlamacppPort is the port llama-server listens on in the image's
	// default command.
	LlamacppPort = 8080
)

// LlamacppServerArgs is the image's default command: llama-server serving
// the tiny model on all interfaces of the container, one thread, a
// 32768-token context split over 4 slots (8192 each).
var LlamacppServerArgs = []string{
	"llama-server", "-m", LlamacppModel, "--jinja", "--no-prefill-assistant",
	"--host", "0.0.0.0", "--port", "8080",
	"-t", "1", "-c", "32768", "-np", "4",
}

// llamacppSid is Debian sid with llama.cpp's server and what the model
// generator needs. sid's Release file is short-lived and often expired on
// mirrors and snapshots, hence Check-Valid-Until false.
var llamacppSid = &debootstrapRecipe{
	suite:     "sid",
	onlySuite: true,
	variant:   "minbase",
	packages:  []string{"ca-certificates", "llama.cpp-tools", "python3-gguf", "python3-numpy"},
	dpkgOpts:  []string{"force-unsafe-io"},
	aptOpts: []string{
		`Acquire::Languages "none"`,
		`APT::Install-Recommends "false"`,
		`Acquire::Check-Valid-Until "false"`,
	},
	filesDir: LlamacppGenerator,
	customize: []string{
		"PYTHONDONTWRITEBYTECODE=1 python3 " + LlamacppGenerator + "/make_tiny_gguf.py --out /models",
		// A smoke check at build time: the server binary runs.
		"llama-server --version",
	},
}

func init() {
	sub, err := fs.Sub(tinyQwen3Files, "tinyqwen3")
	if err != nil {
		panic(err) // embed paths are fixed at compile time
	}
	llamacppSid.files = sub
	cmd := `CMD ["` + strings.Join(LlamacppServerArgs, `", "`) + `"]`
	addRecipe(&recipe{
		name: "llamacpp",
		kind: Engine,
		ref:  "rollout-llamacpp:sid",
		doc:  "Debian sid + llama.cpp-tools (llama-server) with the project's tiny random-weight Qwen3 GGUF at " + LlamacppModel,
		spec: func(context.Context) (string, error) { return llamacppSid.spec() },
		// The engine does not need root: the image runs as agent.
		rootfs: llamacppSid.rootfs,
		layer:  withShell(agentUser, "/bin/bash"),
		prune:  docsPrune,
		changes: append(slices.Clone(baseEnv),
			"WORKDIR /models",
			"USER agent",
			"EXPOSE 8080/tcp",
			"LABEL io.rollout.engine=llamacpp",
			"LABEL io.rollout.engine.model="+LlamacppModel,
			cmd,
		),
	})
}
