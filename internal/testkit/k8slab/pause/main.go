// Command pause is the pod-sandbox ("pause") process of the Kubernetes lab
// (scripts/k8s-lab): the lab has no registry to pull the usual pause image
// from, so it builds this static binary and imports it into every node's
// containerd. It holds the pod's namespaces, reaps zombies when it is the
// pid-namespace init (shareProcessNamespace), and exits on SIGINT/SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
