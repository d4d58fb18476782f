// Package builtin is the one list of the built-in environment protocols:
// importing it registers each with envs/protocol (imported by assemble,
// cmd/rollout and the dev tools).
package builtin

import (
	// The built-in env protocols, each registering itself.
	_ "github.com/rollout-rl/rollout/envs/nemogym"
	_ "github.com/rollout-rl/rollout/envs/openenv"
)
