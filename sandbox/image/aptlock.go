package image

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The dpkg and apt locks an install waits for. apt-get takes them with
// fcntl (POSIX) locks; a fresh cloud machine's boot-time updates
// (unattended-upgrades, cloud-init) hold them for minutes.
var aptLockFiles = []string{"/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock", "/var/cache/apt/archives/lock"}

// DefaultAptLockTimeout bounds how long an install waits for another apt
// process to release the dpkg lock (apt-get's DPkg::Lock::Timeout, apt ≥
// 1.9.11; Debian bookworm has apt 2.6). ROLLOUT_DPKG_LOCK_TIMEOUT (seconds)
// overrides it.
const DefaultAptLockTimeout = 5 * time.Minute

// aptLockTimeout is ROLLOUT_DPKG_LOCK_TIMEOUT, or the default when it is
// unset; a value that is not a whole number of seconds ≥ 0 is an error
// naming it, never a silent default.
func aptLockTimeout() (time.Duration, error) {
	s := os.Getenv("ROLLOUT_DPKG_LOCK_TIMEOUT")
	if s == "" {
		return DefaultAptLockTimeout, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("ROLLOUT_DPKG_LOCK_TIMEOUT=%q: want a whole number of seconds ≥ 0", s)
	}
	return time.Duration(n) * time.Second, nil
}

// AptLockHolders names the processes that hold one of apt's locks now:
// "pid 123 (apt-get install -y foo) holds /var/lib/dpkg/lock-frontend",
// read from /proc/locks (whose entries name the locked file's inode) and
// the holder's /proc/PID/cmdline. Empty when nothing holds them or /proc
// cannot be read.
func AptLockHolders() []string {
	inodes := map[uint64]string{}
	for _, f := range aptLockFiles {
		var st syscall.Stat_t
		if err := syscall.Stat(f, &st); err == nil {
			inodes[st.Ino] = f
		}
	}
	fh, err := os.Open("/proc/locks")
	if err != nil {
		return nil
	}
	defer fh.Close()
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		// "1: POSIX  ADVISORY  WRITE 1234 fe:00:398608 0 EOF"; blocked
		// waiters carry "->" after the index and are not holders.
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] == "->" {
			continue
		}
		dev := strings.Split(f[5], ":")
		ino, err := strconv.ParseUint(dev[len(dev)-1], 10, 64)
		if err != nil {
			continue
		}
		file, ok := inodes[ino]
		if !ok {
			continue
		}
		key := f[4] + " " + file
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, fmt.Sprintf("pid %s (%s) holds %s", f[4], procCmdline(f[4]), file))
	}
	return out
}

func procCmdline(pid string) string {
	b, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil || len(b) == 0 {
		return "exited"
	}
	s := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
