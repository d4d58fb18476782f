package envs

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Harness APIs a harness task may be given (its environment variables).
const (
	HarnessAPIOpenAI    = "openai"    // OPENAI_BASE_URL, OPENAI_API_KEY (Chat Completions and Responses)
	HarnessAPIAnthropic = "anthropic" // ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY (Messages)
)

// How the task prompt reaches a harness.
const (
	PromptStdin = "stdin" // on the harness's standard input (the default)
	PromptFile  = "file"  // in a file; its path in ROLLOUT_PROMPT_FILE
	PromptArg   = "arg"   // appended to the command as one shell-quoted argument
)

// DefaultHarnessPort is the loopback port inside the sandbox a harness's
// base URL names when the env sets none.
const DefaultHarnessPort = 8399

// HarnessPromptFile is where a PromptFile prompt is written in the sandbox.
const HarnessPromptFile = "/tmp/rollout/prompt.txt"

// Harnessed is implemented by envs whose tasks may run an outside harness
// (a YAML env with a harness block): the job refuses what the own loop
// alone supports (distillation and its hints) before any rollout.
type Harnessed interface {
	RunsHarness() bool
}

// Harness makes a task's episode an outside agent harness: a command run in
// the rollout's sandbox (installed in its image) that calls the model
// through a gateway session, instead of rollout's own agent loop. The
// runner records the session's branches and runs the env's reward in the
// same sandbox afterwards.
type Harness struct {
	// Command is run by the sandbox's shell (sh -c).
	Command string
	// APIs name the environment variables the harness is given:
	// HarnessAPIOpenAI and/or HarnessAPIAnthropic.
	APIs []string
	// Prompt is the task prompt (the rendered YAML prompt); PromptVia says
	// how it reaches the harness.
	Prompt    string
	PromptVia string
	// Budget bounds the harness's wall-clock time; past it the harness is
	// killed and the rollout's stop reason is harness_timeout (0: the run's
	// rollout_timeout).
	Budget time.Duration
	// Port is the loopback port inside the sandbox the session is served
	// on (0: DefaultHarnessPort).
	Port int
	// Env adds environment variables of the harness's own.
	Env map[string]string
	// MaxCalls is the session's call limit: the call past it is refused
	// (400) and the rollout's stop reason is harness_call_limit (0: the
	// gateway's, 1,000).
	MaxCalls int
}

// Validate reports a harness spec the runner cannot run.
func (h *Harness) Validate() error {
	if strings.TrimSpace(h.Command) == "" {
		return fmt.Errorf("%w: harness.command is required", ErrConfig)
	}
	if len(h.APIs) == 0 {
		return fmt.Errorf("%w: harness.apis: name at least one of %s, %s", ErrConfig, HarnessAPIOpenAI, HarnessAPIAnthropic)
	}
	for _, a := range h.APIs {
		if a != HarnessAPIOpenAI && a != HarnessAPIAnthropic {
			return fmt.Errorf("%w: harness.apis: unknown API %q (known: %s, %s)", ErrConfig, a, HarnessAPIOpenAI, HarnessAPIAnthropic)
		}
	}
	switch h.PromptVia {
	case "", PromptStdin, PromptFile, PromptArg:
	default:
		return fmt.Errorf("%w: harness.prompt_via: %q is not one of %s, %s, %s", ErrConfig, h.PromptVia, PromptStdin, PromptFile, PromptArg)
	}
	if h.Budget < 0 {
		return fmt.Errorf("%w: harness.budget must not be negative", ErrConfig)
	}
	if h.MaxCalls < 0 {
		return fmt.Errorf("%w: harness.max_calls must not be negative (0: the gateway's limit)", ErrConfig)
	}
	if h.Port < 0 || h.Port > 65535 {
		return fmt.Errorf("%w: harness.port %d out of range 1-65535", ErrConfig, h.Port)
	}
	for k := range h.Env {
		if slices.Contains(reservedHarnessEnv, k) {
			return fmt.Errorf("%w: harness.env: %s is set by rollout (the session's address)", ErrConfig, k)
		}
	}
	return nil
}

// reservedHarnessEnv are the variables the runner sets for a harness.
var reservedHarnessEnv = []string{"OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY",
	"ROLLOUT_MODEL", "ROLLOUT_PROMPT_FILE"}
