package bench

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPUModel      string `json:"cpu_model"`
	Cores         int    `json:"cores"`
	MemoryMB      int64  `json:"memory_mb"`
	OS            string `json:"os"`
	Kernel        string `json:"kernel,omitempty"`
	GoVersion     string `json:"go_version"`
	DockerVersion string `json:"docker_version,omitempty"`
	// DockerStorage is the engine's storage driver: every command a
	// sandbox spawns is read from the root filesystem it makes
	// (fuse-overlayfs costs ~0.3 ms per spawn against overlay2's).
	DockerStorage string `json:"docker_storage,omitempty"`
	// DockerError says why the engine could not be asked.
	DockerError string `json:"docker_error,omitempty"`
	// LoadAvgStart/End are the 1-minute load averages when the run started
	// and ended: how busy the (shared) machine was.
	LoadAvgStart float64 `json:"load_avg_start"`
	LoadAvgEnd   float64 `json:"load_avg_end"`
}

// CollectMachine describes this machine.
func CollectMachine(ctx context.Context) Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, GoVersion: runtime.Version(),
		CPUModel: cpuModel(), MemoryMB: memTotalMB(), Kernel: kernel(), LoadAvgStart: loadAvg()}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli, err := dockerclient.New(cctx)
	if err != nil {
		m.DockerError = firstLine(err.Error())
		return m
	}
	defer cli.Close()
	v, err := cli.ServerVersion(cctx, client.ServerVersionOptions{})
	if err != nil {
		m.DockerError = firstLine(err.Error())
		return m
	}
	m.DockerVersion = v.Version
	if info, err := cli.Info(cctx, client.InfoOptions{}); err == nil {
		m.DockerStorage = info.Info.Driver
	}
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotalMB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb / 1024
		}
	}
	return 0
}

func kernel() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	s := make([]byte, 0, len(u.Release))
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	x, _ := strconv.ParseFloat(f[0], 64)
	return x
}

// processCPU is the CPU time this process has used (user + system, all
// threads).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// daemonCPU is the CPU time used so far by the Docker daemons on this
// host (dockerd and containerd, found by name in /proc). ok is false when
// none is visible (another PID namespace, or a remote engine).
func daemonCPU() (time.Duration, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var total time.Duration
	found := false
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		comm, cpu, ok := parseStatCPU(b)
		if !ok || (comm != "dockerd" && comm != "containerd") {
			continue
		}
		total += cpu
		found = true
	}
	return total, found
}

// parseStatCPU reads the command name and the CPU time (user + system)
// from a /proc/PID/stat line: pid (comm) state ppid ... utime(14) stime(15).
func parseStatCPU(b []byte) (comm string, cpu time.Duration, ok bool) {
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return "", 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return s[open+1 : end], time.Duration(ut+st) * time.Second / clockTicks, true
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100
