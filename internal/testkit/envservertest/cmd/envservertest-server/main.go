// Command envservertest-server serves one of envservertest's env servers
// on a TCP address: -protocol openenv or nemo_gym.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/envservertest"
)

func main() {
	proto := flag.String("protocol", "openenv", "openenv | nemo_gym")
	addr := flag.String("addr", "127.0.0.1:8000", "listen address")
	maxSessions := flag.Int("max-sessions", 0, "openenv: max_concurrent_envs (0: unlimited)")
	steps := flag.Int("steps", 3, "openenv: accepted steps until done")
	flag.Parse()
	var h http.Handler
	switch *proto {
	case "openenv":
		h = envservertest.OpenEnvHandler(envservertest.OpenEnvOptions{MaxSessions: *maxSessions, StepsToDone: *steps})
	case "nemo_gym":
		h = envservertest.NeMoGymHandler(envservertest.NeMoGymOptions{})
	default:
		fmt.Fprintf(os.Stderr, "envservertest-server: unknown protocol %q\n", *proto)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "envservertest-server:", err)
		os.Exit(1)
	}
	fmt.Println("http://" + ln.Addr().String())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "envservertest-server:", err)
		os.Exit(1)
	}
}
