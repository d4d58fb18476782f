package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	_ "github.com/rollout-rl/rollout/sandbox/builtin"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/sandbox"
)

func init() { registerSandbox(newSandboxRunCmd) }

// sandboxFailed is the exit code when the sandbox itself failed, as for
// `docker run`, so it cannot be mistaken for the command's own code.
const sandboxFailed = 125

func newSandboxRunCmd() *cobra.Command {
	var (
		img, network, workdir, user, memory string
		backend                             string
		env                                 []string
		cpus                                float64
		pids                                int64
		timeout                             time.Duration
		shell, readOnly                     bool
	)
	cmd := &cobra.Command{
		Use:   "run --image IMAGE [flags] -- COMMAND [ARG...]",
		Short: "Run one command in a fresh sandbox, print its output and exit with its code",
		Long: "Create a sandbox container with the service's isolation defaults (no network, non-root user,\n" +
			"no capabilities, pids/memory/CPU limits), run one command through the exec agent, print its\n" +
			"stdout and stderr, remove the container and exit with the command's exit code\n" +
			"(124 on timeout, 125 when the sandbox itself failed).",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, errors.New("a command is required after --"))
			}
			if img == "" {
				return usageError(cmd, errors.New("--image is required"))
			}
			spec := sandbox.Spec{Image: img, Network: network, Workdir: workdir, User: user,
				Limits: sandbox.Limits{CPUs: cpus, PIDs: pids, ReadOnlyRoot: readOnly}}
			if memory != "" {
				n, err := units.RAMInBytes(memory)
				if err != nil {
					return usageError(cmd, fmt.Errorf("--memory %q: %w", memory, err))
				}
				spec.Limits.MemoryBytes = n
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usageError(cmd, fmt.Errorf("--env %q: want KEY=VALUE", kv))
				}
				if spec.Env == nil {
					spec.Env = map[string]string{}
				}
				spec.Env[k] = v
			}
			req := sandbox.ExecRequest{Argv: args, Timeout: timeout}
			if shell {
				req = sandbox.ExecRequest{Command: strings.Join(args, " "), Timeout: timeout}
			}
			return runInSandbox(cmd, backend, spec, req)
		},
	}
	f := cmd.Flags()
	f.StringVar(&img, "image", "", "image to run (must be present locally)")
	f.StringVar(&network, "network", sandbox.NetworkNone, "network policy: none, bridge (egress only: not the host, private ranges or other sandboxes) or open (unrestricted)")
	f.StringVar(&workdir, "workdir", "/workspace", "working directory")
	f.StringVar(&user, "user", "", "user to run as (default: agent when the image has it)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 512m (default 2g, no swap)")
	f.Float64Var(&cpus, "cpus", 0, "CPU quota in cores (default 1)")
	f.Int64Var(&pids, "pids", 0, "pids limit (default 512)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command's process group after this long (exit 124)")
	f.BoolVar(&shell, "shell", false, "run the arguments joined as one /bin/sh -c command")
	f.BoolVar(&readOnly, "read-only", false, "read-only root with a tmpfs workdir and /tmp")
	f.StringVar(&backend, "backend", sandbox.BackendDocker, "sandbox backend: docker, or runc (runc directly, no engine daemon; root; network none)")
	return cmd
}

// localBackend is a sandbox backend of this host that runInSandbox closes.
type localBackend interface {
	sandbox.Backend
	Close(ctx context.Context) error
}

// openLocalBackend starts the named backend of this host ("" is docker);
// noReap skips the start-up reap of a one-command run. An unknown name is
// sandbox.ErrInvalid.
func openLocalBackend(ctx context.Context, name string, log *slog.Logger, noReap bool) (localBackend, error) {
	reap := time.Duration(0)
	if noReap {
		reap = -1
	}
	switch name {
	case "":
		name = sandbox.BackendDocker
	case sandbox.BackendDocker, sandbox.BackendRunc:
	default:
		return nil, fmt.Errorf("%w: sandbox backend %q: want docker or runc", sandbox.ErrInvalid, name)
	}
	reg, err := sandbox.Lookup(name)
	if err != nil {
		return nil, err
	}
	return reg.Open(ctx, sandbox.OpenOptions{ReapInterval: reap, Logger: log})
}

func runInSandbox(cmd *cobra.Command, backend string, spec sandbox.Spec, req sandbox.ExecRequest) error {
	ctx := cmd.Context()
	cleanup := context.WithoutCancel(ctx)
	d, err := openLocalBackend(ctx, backend, slog.Default(), true)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalid) {
			return usageError(cmd, err)
		}
		return withExitCode(sandboxFailed, err)
	}
	defer d.Close(cleanup)
	s, err := d.Create(ctx, spec)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalid) {
			return usageError(cmd, err)
		}
		return withExitCode(sandboxFailed, err)
	}
	res, err := s.Exec(ctx, req)
	if cerr := s.Close(cleanup); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return withExitCode(sandboxFailed, err)
	}
	_, _ = cmd.OutOrStdout().Write(res.Stdout)
	_, _ = cmd.ErrOrStderr().Write(res.Stderr)
	note := ""
	if res.StdoutTruncated || res.StderrTruncated {
		note = fmt.Sprintf(", output truncated (stdout %d bytes, stderr %d bytes in total)", res.StdoutTotal, res.StderrTotal)
	}
	if res.TimedOut {
		note += ", timed out"
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "rollout: exit code %d in %s%s\n", res.ExitCode, res.Duration.Round(time.Millisecond), note)
	if res.ExitCode != 0 {
		return withExitCode(res.ExitCode, nil)
	}
	return nil
}
