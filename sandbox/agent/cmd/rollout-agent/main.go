// Command rollout-agent is the in-container exec agent (package
// sandbox/agent). Build it static: CGO_ENABLED=0 go build -o bin/rollout-agent ./sandbox/agent/cmd/rollout-agent
package main

import (
	"os"

	"github.com/rollout-rl/rollout/sandbox/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:])) }
