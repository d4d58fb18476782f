// Package doctor checks that this machine can run the main job: a
// reachable Docker engine with a usable API version, storage driver and free
// disk, current sandbox base images, the sandbox agent binary, and whether
// the runc backend can run here. Every
// problem is one line saying what is wrong and what to run.
package doctor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/image"
)

// Status of one check.
type Status int

// Statuses, from harmless to blocking. Only Fail makes the machine unfit for
// the main job.
const (
	Info Status = iota
	OK
	Warn
	Fail
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	case Fail:
		return "FAIL"
	default:
		return "info"
	}
}

// Check is one line of the report.
type Check struct {
	Name   string
	Status Status
	// Detail is what was found; for Warn and Fail it ends with what to do.
	Detail string
}

func (c Check) String() string { return fmt.Sprintf("%-4s  %s: %s", c.Status, c.Name, c.Detail) }

// Report is the outcome of Run.
type Report struct{ Checks []Check }

// OK reports whether nothing failed.
func (r Report) OK() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return false
		}
	}
	return true
}

func (r *Report) add(name string, s Status, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Status: s, Detail: fmt.Sprintf(format, args...)})
}

// Free-disk thresholds for the Docker root directory: sandboxes write
// into container layers and task images land there too.
const (
	minFreeBytes  = 2 << 30
	warnFreeBytes = 10 << 30
	minAPIVersion = "1.40" // oldest API the moby client speaks
)

// Options select what Run checks; the zero value checks everything.
type Options struct {
	// SkipAgent leaves out the sandbox agent check, which may compile the
	// agent from source the first time.
	SkipAgent bool
}

// Run performs the checks. A missing engine ends the run after one line:
// everything else depends on it.
func Run(ctx context.Context, opts Options) Report {
	var r Report
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli, err := dockerclient.New(cctx)
	if err != nil {
		r.add("docker engine", Fail, "%v", err)
		return r
	}
	defer cli.Close()

	sv, err := cli.ServerVersion(cctx, client.ServerVersionOptions{})
	switch {
	case err != nil:
		r.add("docker engine", Fail, "reachable at %s but /version failed: %v", dockerclient.Host(), err)
		return r
	case versionLess(sv.APIVersion, minAPIVersion):
		r.add("docker engine", Fail, "Docker %s speaks API %s, rollout needs >= %s: upgrade the Docker engine", sv.Version, sv.APIVersion, minAPIVersion)
	default:
		r.add("docker engine", OK, "Docker %s at %s, API %s (client uses %s)", sv.Version, dockerclient.Host(), sv.APIVersion, cli.ClientVersion())
	}

	info, err := cli.Info(cctx, client.InfoOptions{})
	if err != nil {
		r.add("docker info", Fail, "%v: check the daemon logs (`journalctl -u docker`)", err)
	} else {
		checkDriver(&r, info.Info.Driver)
		checkDisk(&r, info.Info.DockerRootDir)
	}

	missing := false
	for _, name := range image.Names() {
		if !checkImage(ctx, &r, cli, name) {
			missing = true
		}
	}
	for _, name := range image.EngineNames() {
		checkEngineImage(ctx, &r, cli, name)
	}
	if missing {
		if p, err := image.MmdebstrapPath(); err == nil {
			r.add("mmdebstrap", Info, "found at %s (needed to build rollout-sandbox:bookworm)", p)
		} else {
			r.add("mmdebstrap", Info, "not installed; `rollout sandbox image build` installs it when run as root, otherwise run `sudo apt-get install mmdebstrap`")
		}
	}

	checkRunc(&r)
	if !opts.SkipAgent {
		if a, err := sandbox.ResolveAgent(); err != nil {
			r.add("sandbox agent", Fail, "%v", err)
		} else {
			r.add("sandbox agent", OK, "%s", strings.TrimSpace(a.Path+" "+strings.Join(a.Args, " ")))
		}
	}
	return r
}

// checkRunc says whether sandbox.backend runc can run here (informational:
// docker is the default backend).
func checkRunc(r *Report) {
	p, err := exec.LookPath("runc")
	switch {
	case err != nil:
		r.add("runc backend", Info, "runc not found: sandbox.backend runc needs it (Debian: apt-get install runc)")
	case os.Geteuid() != 0:
		r.add("runc backend", Info, "runc at %s; sandbox.backend runc needs root (overlay mounts, cgroups)", p)
	default:
		r.add("runc backend", OK, "runc at %s, running as root: sandbox.backend runc is available", p)
	}
}

func checkDriver(r *Report, driver string) {
	switch driver {
	case "overlay2", "overlay", "btrfs", "zfs", "fuse-overlayfs":
		r.add("storage driver", OK, "%s", driver)
	case "vfs":
		r.add("storage driver", Warn, "vfs copies the whole image for every container (slow sandboxes, much disk): configure overlay2 in /etc/docker/daemon.json")
	default:
		r.add("storage driver", OK, "%s", driver)
	}
}

func checkDisk(r *Report, root string) {
	var st syscall.Statfs_t
	dir := root
	err := syscall.Statfs(dir, &st)
	if err != nil && dir != "/var/lib/docker" {
		dir = "/var/lib/docker"
		err = syscall.Statfs(dir, &st)
	}
	if err != nil {
		// A remote engine or one in a VM: its disk is not ours to see.
		r.add("disk", Info, "cannot read free space of the Docker root %q from this host (%v)", root, err)
		return
	}
	free := st.Bavail * uint64(st.Bsize)
	switch {
	case free < minFreeBytes:
		r.add("disk", Fail, "%s free in %s, need at least %s: free space (e.g. `docker system prune`)", gib(free), dir, gib(minFreeBytes))
	case free < warnFreeBytes:
		r.add("disk", Warn, "%s free in %s; below %s sandboxes and task images may run out: consider `docker system prune`", gib(free), dir, gib(warnFreeBytes))
	default:
		r.add("disk", OK, "%s free in %s", gib(free), dir)
	}
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// checkImage reports one base image and returns false when it must be
// (re)built.
func checkImage(ctx context.Context, r *Report, cli image.API, name string) bool {
	label := "image " + image.Ref(name)
	fix := fmt.Sprintf("run `rollout sandbox image build --name %s`", name)
	st, err := image.Inspect(ctx, cli, name)
	switch {
	case err != nil:
		r.add(label, Fail, "%v", err)
		return false
	case !st.Present:
		r.add(label, Fail, "missing: %s", fix)
		return false
	case st.WantErr != nil:
		r.add(label, Warn, "present (recipe %s) but its recipe cannot be checked here: %v", short(st.HaveHash), st.WantErr)
		return true
	case st.HaveHash != st.WantHash:
		r.add(label, Fail, "stale (recipe %s, current %s): %s", short(st.HaveHash), short(st.WantHash), fix)
		return false
	default:
		r.add(label, OK, "present, recipe %s current", short(st.HaveHash))
		return true
	}
}

// checkEngineImage reports an engine image (docs/real-engines.md). Rollouts
// do not need it, so a missing or stale one is only Info.
func checkEngineImage(ctx context.Context, r *Report, cli image.API, name string) {
	label := "image " + image.Ref(name)
	fix := fmt.Sprintf("`rollout sandbox image build --name %s` builds it (only the real-engine tests and `rollout engine %s` need it)", name, name)
	st, err := image.Inspect(ctx, cli, name)
	switch {
	case err != nil:
		r.add(label, Info, "%v", err)
	case !st.Present:
		r.add(label, Info, "not built: %s", fix)
	case st.WantErr == nil && st.HaveHash != st.WantHash:
		r.add(label, Info, "stale (recipe %s, current %s): %s", short(st.HaveHash), short(st.WantHash), fix)
	default:
		r.add(label, OK, "present, recipe %s", short(st.HaveHash))
	}
}

func short(h string) string {
	if h == "" {
		return "none"
	}
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// versionLess compares dotted API versions numerically ("1.9" < "1.41").
func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y int
		if i < len(pa) {
			fmt.Sscan(pa[i], &x)
		}
		if i < len(pb) {
			fmt.Sscan(pb[i], &y)
		}
		if x != y {
			return x < y
		}
	}
	return false
}
