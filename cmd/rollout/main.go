// Command rollout collects scored agent trajectories for RL training, SFT
// data generation and evaluation. See README.md.
package main

import "os"

func main() {
	os.Exit(execute(os.Args[1:]))
}
