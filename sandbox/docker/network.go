package docker

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/sandbox"
)

// Network isolation of Spec.Network = NetworkBridge ("egress only").
//
// Such sandboxes join one project-managed Docker network, EgressNetwork,
// a bridge with inter-container communication disabled
// (com.docker.network.bridge.enable_icc=false) on a fixed interface,
// EgressBridge. Host firewall rules, installed by the backend (it must be
// root, with iptables; the same iptables the engine uses), then drop:
//
//   - every packet from that interface to the host itself (INPUT): the
//     host's addresses, the bridge gateway and docker0's 172.17.0.1, and
//     the services listening there, except replies to connections the
//     host opened;
//   - forwarded packets from that interface to private, link-local,
//     shared and multicast ranges (DOCKER-USER): other sandboxes on other
//     networks, the host's LAN, cloud metadata (169.254.169.254), and
//     ports other containers publish on the host.
//
// Other sandboxes on the same network are unreachable through ICC=false.
// Public addresses stay reachable (egress), as do DNS answers through the
// engine's embedded resolver (inside the container's namespace).
// NetworkOpen is the engine's default bridge without these rules, for
// tasks that need the host or the LAN: an explicit choice.
const (
	EgressNetwork = "rollout-egress"
	EgressBridge  = "rollout-egr0"
	chainInput    = "ROLLOUT-EGRESS-IN"
	chainForward  = "ROLLOUT-EGRESS-FWD"
)

// blockedRanges are the destinations an egress-only sandbox may not reach
// through forwarding.
var blockedRanges = []string{
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", // RFC 1918
	"100.64.0.0/10",  // shared address space (CGNAT)
	"169.254.0.0/16", // link-local, cloud metadata
	"127.0.0.0/8",    // loopback (route_localnet)
	"224.0.0.0/4",    // multicast
	"0.0.0.0/8", "240.0.0.0/4",
}

type egressState struct {
	mu  sync.Mutex
	ok  bool
	err error
}

// ensureEgress creates the egress network and installs the firewall rules
// once per backend; a failure is reported to every create that needs it
// (and tried again by the next one).
func (d *Docker) ensureEgress(ctx context.Context) error {
	d.egress.mu.Lock()
	defer d.egress.mu.Unlock()
	if d.egress.ok {
		return nil
	}
	if !d.bind {
		return fmt.Errorf("%w: network %q needs firewall rules on the engine's host, which is not this one (remote engine); use network %q to give unrestricted network access",
			sandbox.ErrInvalid, sandbox.NetworkBridge, sandbox.NetworkOpen)
	}
	if err := d.ensureEgressNetwork(ctx); err != nil {
		return err
	}
	if err := installEgressRules(ctx); err != nil {
		return fmt.Errorf("%w: network %q: install host firewall rules: %v (the backend must run as root with iptables; or use network %q, without isolation)",
			sandbox.ErrInvalid, sandbox.NetworkBridge, err, sandbox.NetworkOpen)
	}
	d.egress.ok = true
	return nil
}

func (d *Docker) ensureEgressNetwork(ctx context.Context) error {
	err := d.daemon(ctx, "network_inspect", 30*time.Second, func(cctx context.Context) error {
		res, err := d.cli.NetworkInspect(cctx, EgressNetwork, client.NetworkInspectOptions{})
		if err != nil {
			return err
		}
		if res.Network.Options["com.docker.network.bridge.enable_icc"] != "false" ||
			res.Network.Options["com.docker.network.bridge.name"] != EgressBridge {
			return fmt.Errorf("%w: a network named %s exists without the project's settings (icc off, bridge %s); remove it (docker network rm %s)",
				sandbox.ErrInvalid, EgressNetwork, EgressBridge, EgressNetwork)
		}
		return nil
	})
	if err == nil || errors.Is(err, sandbox.ErrInvalid) {
		return err
	}
	if !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("%w: inspect network %s: %v", sandbox.ErrUnavailable, EgressNetwork, err)
	}
	err = d.daemon(ctx, "network_create", 60*time.Second, func(cctx context.Context) error {
		_, err := d.cli.NetworkCreate(cctx, EgressNetwork, client.NetworkCreateOptions{
			Driver: "bridge",
			Options: map[string]string{
				"com.docker.network.bridge.enable_icc":           "false",
				"com.docker.network.bridge.name":                 EgressBridge,
				"com.docker.network.bridge.enable_ip_masquerade": "true",
			},
			Labels: map[string]string{sandbox.LabelManaged: "true"},
		})
		if cerrdefs.IsConflict(err) {
			return nil // created meanwhile by another process
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: create network %s: %v", sandbox.ErrUnavailable, EgressNetwork, err)
	}
	return nil
}

// egressRules are the iptables commands (filter table) that make the
// rules; each chain is flushed and refilled, so re-running is idempotent.
func egressRules() [][]string {
	rules := [][]string{
		{"-A", chainInput, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"},
		{"-A", chainInput, "-j", "DROP"},
		{"-A", chainForward, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"},
	}
	for _, r := range blockedRanges {
		rules = append(rules, []string{"-A", chainForward, "-d", r, "-j", "DROP"})
	}
	return append(rules, []string{"-A", chainForward, "-j", "RETURN"})
}

var iptablesMu sync.Mutex

func installEgressRules(ctx context.Context) error {
	iptablesMu.Lock()
	defer iptablesMu.Unlock()
	if _, err := exec.LookPath("iptables"); err != nil {
		return err
	}
	for _, chain := range []string{chainInput, chainForward} {
		if _, err := ipt(ctx, "-n", "-L", chain); err != nil {
			if _, err := ipt(ctx, "-N", chain); err != nil {
				return err
			}
		}
		if _, err := ipt(ctx, "-F", chain); err != nil {
			return err
		}
	}
	for _, r := range egressRules() {
		if _, err := ipt(ctx, r...); err != nil {
			return err
		}
	}
	// The engine creates DOCKER-USER when it starts; make sure it exists
	// (and is jumped to from FORWARD by the engine).
	if _, err := ipt(ctx, "-n", "-L", "DOCKER-USER"); err != nil {
		return fmt.Errorf("the engine's DOCKER-USER chain is missing (is the engine managing iptables?): %w", err)
	}
	jumps := [][]string{
		{"INPUT", "-i", EgressBridge, "-j", chainInput},
		{"DOCKER-USER", "-i", EgressBridge, "-j", chainForward},
	}
	for _, j := range jumps {
		if _, err := ipt(ctx, append([]string{"-C"}, j...)...); err == nil {
			continue
		}
		if _, err := ipt(ctx, append([]string{"-I", j[0], "1"}, j[1:]...)...); err != nil {
			return err
		}
	}
	return nil
}

func ipt(ctx context.Context, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "iptables", append([]string{"-w", "10"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
