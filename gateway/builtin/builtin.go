// Package builtin is the one list of the gateway's built-in front doors
// (imported by the composition root, the CLI and the dev tools).
package builtin

import (
	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/anthropic"
	"github.com/rollout-rl/rollout/gateway/openaichat"
	"github.com/rollout-rl/rollout/gateway/responses"
)

// FrontDoors returns every built-in front door.
func FrontDoors() []gateway.FrontDoor {
	return []gateway.FrontDoor{openaichat.Door{}, responses.New(), anthropic.New()}
}
