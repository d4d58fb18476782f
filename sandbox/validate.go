package sandbox

import (
	"errors"
	"fmt"
	"math"
	"path"
	"strings"
)

// ValidateSpec applies the checks every backend shares and fills the
// defaults of a spec (workdir, network, runtime, limits) in place; a backend
// then refuses what it does not build. The error is unwrapped: the backend
// wraps it with ErrInvalid.
func ValidateSpec(spec *Spec) error {
	if spec.Image == "" {
		return errors.New("image is empty")
	}
	if spec.Workdir == "" {
		spec.Workdir = "/workspace"
	}
	if !path.IsAbs(spec.Workdir) {
		return fmt.Errorf("workdir %q is not absolute", spec.Workdir)
	}
	switch spec.Network {
	case "":
		spec.Network = NetworkNone
	case NetworkNone, NetworkBridge, NetworkOpen:
	default:
		return fmt.Errorf("network %q (want %q, %q for egress only, or %q for unrestricted access)", spec.Network, NetworkNone, NetworkBridge, NetworkOpen)
	}
	switch spec.Runtime {
	case "":
		spec.Runtime = RuntimeRunc
	case RuntimeRunc, RuntimeRunsc:
	default:
		return fmt.Errorf("runtime %q (want %q or %q)", spec.Runtime, RuntimeRunc, RuntimeRunsc)
	}
	if spec.Runtime == RuntimeRunsc && spec.Network != NetworkNone {
		return fmt.Errorf("runtime %q with network %q: not implemented (runsc sandboxes have no network; see docs/security.md)", spec.Runtime, spec.Network)
	}
	l := &spec.Limits
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"memory", l.MemoryBytes < 0}, {"cpus", l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0)}, {"pids", l.PIDs < 0},
		{"disk", l.DiskBytes < 0}, {"max lifetime", l.MaxLifetime < 0}, {"idle timeout", l.IdleTimeout < 0},
	} {
		if f.neg {
			return fmt.Errorf("%s limit must not be negative", f.name)
		}
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = DefaultLimits.MemoryBytes
	}
	if l.MemoryBytes < 8<<20 {
		return fmt.Errorf("memory limit %d bytes is below 8 MiB", l.MemoryBytes)
	}
	if l.CPUs == 0 {
		l.CPUs = DefaultLimits.CPUs
	}
	if l.PIDs == 0 {
		l.PIDs = DefaultLimits.PIDs
	}
	if l.PIDs < 16 {
		return fmt.Errorf("pids limit %d is below 16", l.PIDs)
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = DefaultLimits.DiskBytes
	}
	if l.DiskBytes < 1<<20 {
		return fmt.Errorf("disk limit %d bytes is below 1 MiB", l.DiskBytes)
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") {
			return fmt.Errorf("bad env name %q", k)
		}
	}
	for k := range spec.Labels {
		if strings.HasPrefix(k, reservedPrefix) || k == LabelManaged {
			return fmt.Errorf("label %q is reserved", k)
		}
	}
	for _, f := range spec.Files {
		if !path.IsAbs(f.Path) {
			return fmt.Errorf("file path %q is not absolute", f.Path)
		}
	}
	return nil
}
