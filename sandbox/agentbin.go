package sandbox

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// AgentSubcommand is the hidden `rollout` subcommand that runs the agent,
// used when the rollout binary itself is static and serves as the agent.
const AgentSubcommand = "__sandbox-agent"

// AgentBinary is the agent program to place into containers.
type AgentBinary struct {
	Path string   // host path of a static linux/amd64 executable
	Args []string // arguments before the agent's own flags
}

var (
	agentOnce sync.Once
	agentBin  AgentBinary
	agentErr  error
)

// ResolveAgent finds the agent binary, in order: $ROLLOUT_AGENT; a
// `rollout-agent` next to the running executable (what `make build`
// produces); the running executable itself when it is statically linked
// (it then serves the hidden AgentSubcommand); a build from this source tree
// into the user cache when the Go toolchain and the source are present.
func ResolveAgent() (AgentBinary, error) {
	agentOnce.Do(func() { agentBin, agentErr = resolveAgent() })
	return agentBin, agentErr
}

func resolveAgent() (AgentBinary, error) {
	if p := os.Getenv("ROLLOUT_AGENT"); p != "" {
		if err := checkStatic(p); err != nil {
			return AgentBinary{}, fmt.Errorf("ROLLOUT_AGENT=%s: %w", p, err)
		}
		return AgentBinary{Path: p}, nil
	}
	exe, exeErr := os.Executable()
	if exeErr == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			p := filepath.Join(filepath.Dir(exe), "rollout-agent")
			if checkStatic(p) == nil {
				return AgentBinary{Path: p}, nil
			}
			if filepath.Base(exe) == "rollout" && checkStatic(exe) == nil {
				return AgentBinary{Path: exe, Args: []string{AgentSubcommand}}, nil
			}
		}
	}
	if p, err := buildAgentFromSource(); err == nil {
		return AgentBinary{Path: p}, nil
	}
	return AgentBinary{}, errors.New("sandbox agent binary not found: build it with " +
		"`CGO_ENABLED=0 go build -o bin/rollout-agent ./sandbox/agent/cmd/rollout-agent` " +
		"(make build does this) and keep it next to the rollout binary, or set ROLLOUT_AGENT to its path")
}

// agentOption is a backend's agent: opt when given (checked), else
// ResolveAgent's; the path made absolute.
func AgentOption(opt *AgentBinary) (AgentBinary, error) {
	var ab AgentBinary
	if opt != nil {
		ab = *opt
		if err := checkStatic(ab.Path); err != nil {
			return ab, fmt.Errorf("%w: agent %s: %v", ErrInvalid, ab.Path, err)
		}
	} else {
		var err error
		if ab, err = ResolveAgent(); err != nil {
			return ab, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	if abs, err := filepath.Abs(ab.Path); err == nil {
		ab.Path = abs
	}
	return ab, nil
}

// checkStatic accepts an x86-64 ELF executable without a dynamic loader:
// it has to run in any image, including FROM scratch.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("not an x86-64 executable (%v)", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked; build with CGO_ENABLED=0")
		}
	}
	return nil
}

// buildAgentFromSource covers `go install`/`go run` from a checkout: the
// source directory is known from this file's compile-time path.
func buildAgentFromSource() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("no source path")
	}
	root := filepath.Dir(filepath.Dir(file))
	if _, err := os.Stat(filepath.Join(root, "sandbox", "agent", "cmd", "rollout-agent")); err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	// One binary per source tree, written under a temporary name and
	// renamed into place: two checkouts on one host (or two test binaries
	// of one) never hand a container each other's agent or a half-written
	// file.
	sum := sha256.Sum256([]byte(root))
	out := filepath.Join(cache, "rollout", "agent-"+hex.EncodeToString(sum[:6]), "rollout-agent")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".rollout-agent-*")
	if err != nil {
		return "", err
	}
	_ = tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", tmp.Name(), "./sandbox/agent/cmd/rollout-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build agent: %v: %s", err, b)
	}
	if err := checkStatic(tmp.Name()); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}
