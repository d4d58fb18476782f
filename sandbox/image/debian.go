package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// bookworm is a Debian 12 minbase system with the tools coding tasks need.
var bookworm = &debootstrapRecipe{
	suite:   "bookworm",
	variant: "minbase",
	packages: []string{
		"bash", "ca-certificates", "coreutils", "git", "patch", "procps",
		"python3", "python3-pytest", "ripgrep",
	},
	dpkgOpts: []string{
		// No fsync per unpacked file: the tree is thrown away after
		// packing, so durability buys nothing and costs most of the time.
		"force-unsafe-io",
	},
	aptOpts: []string{
		`Acquire::Languages "none"`,
		`APT::Install-Recommends "false"`,
	},
}

// baseEnv is the environment every image of the project sets.
var baseEnv = []string{
	"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"ENV LANG=C.UTF-8",
	"ENV PYTHONDONTWRITEBYTECODE=1",
}

func init() {
	addRecipe(&recipe{
		name:   "bookworm",
		doc:    "Debian 12 minbase + bash, coreutils, python3, pytest, git, patch, ripgrep, procps, ca-certificates",
		spec:   func(context.Context) (string, error) { return bookworm.spec() },
		rootfs: bookworm.rootfs,
		layer:  withShell(agentUser, "/bin/bash"),
		// Documentation, man pages and translations: nothing in a sandbox
		// reads them. They are dropped from the tar stream rather than with
		// dpkg path-exclude options, because with those mmdebstrap pipes
		// every essential package through a Python filter, which cost
		// about a minute on 2 busy cores.
		prune:   docsPrune,
		changes: append(slices.Clone(baseEnv), "WORKDIR /workspace", `CMD ["/bin/bash"]`),
	})
}

func withShell(l userLayer, shell string) userLayer { l.Shell = shell; return l }

// debootstrapRecipe is a rootfs made by mmdebstrap from Debian packages.
type debootstrapRecipe struct {
	suite    string
	variant  string
	packages []string
	dpkgOpts []string
	aptOpts  []string
	// onlySuite uses the suite alone, without <suite>-updates and
	// <suite>-security (sid has neither).
	onlySuite bool
	// files are uploaded into the tree at filesDir after the packages are
	// installed; customize are shell commands then run inside the tree
	// (chroot), in order. Both are part of the spec.
	files     fs.FS
	filesDir  string
	customize []string
}

// spec deliberately leaves out the mirror: the same recipe built from two
// mirrors of one archive is the same image. Package versions are not part
// of it either (they move with point releases); `--force` picks them up.
func (d *debootstrapRecipe) spec() (string, error) {
	s := fmt.Sprintf("mmdebstrap suite=%s variant=%s include=%s dpkgopt=%s aptopt=%s components=main suites=%s",
		d.suite, d.variant, strings.Join(d.packages, ","), strings.Join(d.dpkgOpts, "|"),
		strings.Join(d.aptOpts, "|"), strings.Join(d.suites(), ","))
	if d.files == nil && len(d.customize) == 0 {
		// Unchanged text for the recipes that have neither, so their
		// hash (and images) stay what they were.
		return s, nil
	}
	var b strings.Builder
	b.WriteString(s)
	files, err := d.fileList()
	if err != nil {
		return "", err
	}
	for _, f := range files {
		data, err := fs.ReadFile(d.files, f)
		if err != nil {
			return "", fmt.Errorf("read %s: %w", f, err)
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "\nfile %s sha256=%s", path.Join(d.filesDir, f), hex.EncodeToString(sum[:]))
	}
	for _, c := range d.customize {
		fmt.Fprintf(&b, "\ncustomize: %s", c)
	}
	return b.String(), nil
}

// fileList is the regular files of d.files, sorted.
func (d *debootstrapRecipe) fileList() ([]string, error) {
	if d.files == nil {
		return nil, nil
	}
	var out []string
	err := fs.WalkDir(d.files, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list recipe files: %w", err)
	}
	sort.Strings(out)
	return out, nil
}

func (d *debootstrapRecipe) suites() []string {
	if d.onlySuite {
		return []string{d.suite}
	}
	return []string{d.suite, d.suite + "-updates", d.suite + "-security"}
}

// sources returns one-line apt sources for mmdebstrap, using this host's
// configured Debian mirrors when it has some.
func (d *debootstrapRecipe) sources() []string {
	m := hostMirrors("/etc/apt")
	main := m[d.suite]
	if main == "" {
		main = "http://deb.debian.org/debian"
	}
	if d.onlySuite {
		return []string{fmt.Sprintf("deb %s %s main", main, d.suite)}
	}
	updates := m[d.suite+"-updates"]
	if updates == "" {
		updates = main
	}
	security := m[d.suite+"-security"]
	if security == "" {
		security = "http://deb.debian.org/debian-security"
	}
	return []string{
		fmt.Sprintf("deb %s %s main", main, d.suite),
		fmt.Sprintf("deb %s %s-updates main", updates, d.suite),
		fmt.Sprintf("deb %s %s-security main", security, d.suite),
	}
}

// args are mmdebstrap's arguments; staged is the host directory holding
// d.files (from stage), "" when there are none.
func (d *debootstrapRecipe) args(staged string) []string {
	args := []string{
		"--variant=" + d.variant,
		"--include=" + strings.Join(d.packages, ","),
		"--format=tar",
		"--mode=auto",
	}
	for _, o := range d.dpkgOpts {
		args = append(args, "--dpkgopt="+o)
	}
	for _, o := range d.aptOpts {
		args = append(args, "--aptopt="+o)
	}
	if staged != "" {
		// copy-in copies the staged directory (by its base name) into the
		// parent of filesDir.
		parent, base := path.Split(strings.TrimSuffix(d.filesDir, "/"))
		args = append(args,
			`--customize-hook=mkdir -p "$1`+parent+`"`,
			"--customize-hook=copy-in "+filepath.Join(staged, base)+" "+parent)
	}
	for _, c := range d.customize {
		args = append(args, `--customize-hook=chroot "$1" /bin/sh -c '`+strings.ReplaceAll(c, "'", `'\''`)+`'`)
	}
	// Target "-" streams the tar to stdout, so it goes straight into the
	// import without a temporary file.
	args = append(args, d.suite, "-")
	return append(args, d.sources()...)
}

func (d *debootstrapRecipe) rootfs(ctx context.Context, w io.Writer, log io.Writer) error {
	bin, err := ensureMmdebstrap(ctx, log)
	if err != nil {
		return err
	}
	staged := ""
	if d.files != nil {
		dir, err := os.MkdirTemp("", "rollout-recipe-")
		if err != nil {
			return fmt.Errorf("stage recipe files: %w", err)
		}
		defer os.RemoveAll(dir)
		if err := d.stage(filepath.Join(dir, path.Base(d.filesDir))); err != nil {
			return err
		}
		staged = dir
	}
	cmd := exec.CommandContext(ctx, bin, d.args(staged)...)
	cmd.Env = systemEnv()
	// On cancellation ask politely: mmdebstrap then unmounts /proc, /sys
	// and /dev from its chroot and removes its temporary directory, which
	// SIGKILL would leave behind.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Stdout = w
	tail := &tailBuffer{max: 4096}
	if log != nil {
		cmd.Stderr = io.MultiWriter(tail, log)
	} else {
		cmd.Stderr = tail
	}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("mmdebstrap %s: %w\n%s", d.suite, err, tail.String())
	}
	return nil
}

// stage writes d.files under dir (world-readable: the hooks may run as
// another user in unshare mode).
func (d *debootstrapRecipe) stage(dir string) error {
	files, err := d.fileList()
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := fs.ReadFile(d.files, f)
		if err != nil {
			return fmt.Errorf("stage %s: %w", f, err)
		}
		dst := filepath.Join(dir, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("stage %s: %w", f, err)
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return fmt.Errorf("stage %s: %w", f, err)
		}
	}
	return nil
}

// systemEnv is the environment with PATH reduced to the system
// directories. mmdebstrap runs helpers through `env python3` once per
// package; a user-level python shim first in PATH (pyenv: ~0.5 s per start)
// made extraction alone take minutes.
func systemEnv() []string {
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return env
}

// ensureMmdebstrap finds mmdebstrap, installing it with apt-get when it is
// missing and we are root.
func ensureMmdebstrap(ctx context.Context, log io.Writer) (string, error) {
	if p, err := exec.LookPath("mmdebstrap"); err == nil {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%w: mmdebstrap not found; install it with `sudo apt-get install mmdebstrap` (Debian/Ubuntu package mmdebstrap)", ErrMissingTool)
	}
	if err := aptInstall(ctx, log, "mmdebstrap"); err != nil {
		return "", err
	}
	p, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return "", fmt.Errorf("%w: mmdebstrap still not found after apt-get install", ErrMissingTool)
	}
	return p, nil
}

// MmdebstrapPath reports where mmdebstrap is, for `rollout doctor`.
func MmdebstrapPath() (string, error) { return exec.LookPath("mmdebstrap") }

// aptInstall installs pkgs with apt-get. Another apt process holding the
// dpkg lock (a fresh machine's boot-time updates) is waited for, at most
// aptLockTimeout, and named: when the wait starts, and in the error when it
// did not end in time. The package lists are updated only when the install
// fails for another reason (a fresh image without lists).
func aptInstall(ctx context.Context, log io.Writer, pkgs ...string) error {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%w: %s not found and apt-get is not available; install %s with your package manager", ErrMissingTool, strings.Join(pkgs, " "), strings.Join(pkgs, " "))
	}
	timeout, err := aptLockTimeout()
	if err != nil {
		return err
	}
	run := func(args ...string) error {
		if h := AptLockHolders(); len(h) > 0 && log != nil {
			fmt.Fprintf(log, "waiting up to %s for the dpkg lock: %s\n", timeout, strings.Join(h, "; "))
		}
		args = append([]string{"-o", "DPkg::Lock::Timeout=" + strconv.Itoa(int(timeout.Seconds()))}, args...)
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(systemEnv(), "DEBIAN_FRONTEND=noninteractive")
		tail := &tailBuffer{max: 4096}
		// One writer value for both streams: exec then uses one pipe and
		// one copier, so the tail buffer is never written concurrently.
		var w io.Writer = tail
		if log != nil {
			w = io.MultiWriter(tail, log)
		}
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Run(); err != nil {
			if h := AptLockHolders(); len(h) > 0 {
				return fmt.Errorf("apt-get %s: the dpkg lock is still held after waiting %s: %s (another package manager is running, e.g. a boot-time unattended-upgrades: let it finish, then run again): %w",
					strings.Join(args, " "), timeout, strings.Join(h, "; "), err)
			}
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, tail.String())
		}
		return nil
	}
	if log != nil {
		fmt.Fprintf(log, "installing %s with apt-get\n", strings.Join(pkgs, " "))
	}
	install := append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)
	err = run(install...)
	if err == nil {
		return nil
	}
	if len(AptLockHolders()) > 0 {
		return fmt.Errorf("%w: %v", ErrMissingTool, err)
	}
	if err := run("update"); err != nil {
		return fmt.Errorf("%w: %v", ErrMissingTool, err)
	}
	if err := run(install...); err != nil {
		return fmt.Errorf("%w: %v", ErrMissingTool, err)
	}
	return nil
}

// hostMirrors maps suite → archive URI from the apt sources of this host
// (one-line sources.list and deb822 *.sources), first match wins.
func hostMirrors(etcApt string) map[string]string {
	out := map[string]string{}
	files := []string{filepath.Join(etcApt, "sources.list")}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", pat))
		files = append(files, m...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") || looksDeb822(data) {
			parseDeb822(data, out)
		} else {
			parseOneLine(data, out)
		}
	}
	return out
}

func looksDeb822(data []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		return strings.HasPrefix(strings.ToLower(l), "types:")
	}
	return false
}

func parseOneLine(data []byte, out map[string]string) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		i := 1
		if strings.HasPrefix(f[i], "[") { // options: [arch=amd64 signed-by=...]
			for i < len(f) && !strings.HasSuffix(f[i], "]") {
				i++
			}
			i++
		}
		if i+1 >= len(f) {
			continue
		}
		uri, suite := f[i], f[i+1]
		if _, ok := out[suite]; !ok && isDebianURI(uri) {
			out[suite] = uri
		}
	}
}

func parseDeb822(data []byte, out map[string]string) {
	for _, stanza := range strings.Split(string(data), "\n\n") {
		fields := map[string]string{}
		for _, l := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "#") {
				continue
			}
			k, v, ok := strings.Cut(l, ":")
			if !ok || strings.HasPrefix(l, " ") {
				continue
			}
			fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
		if !strings.Contains(" "+fields["types"]+" ", " deb ") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		uris := strings.Fields(fields["uris"])
		if len(uris) == 0 || !isDebianURI(uris[0]) {
			continue
		}
		for _, s := range strings.Fields(fields["suites"]) {
			if _, ok := out[s]; !ok {
				out[s] = uris[0]
			}
		}
	}
}

// isDebianURI keeps only archive mirrors mmdebstrap can use from the host's
// view; file: and cdrom: sources are host-local paths.
func isDebianURI(u string) bool {
	return strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")
}

// tailBuffer keeps the last max bytes written, for error messages.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.buf)) }
