package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
)

func init() {
	addRecipe(&recipe{
		name: "busybox",
		doc:  "static busybox (Debian busybox-static) FROM scratch, for fast tests",
		spec: busyboxSpec,
		prepare: func(ctx context.Context, log io.Writer) error {
			_, err := ensureBusybox(ctx, log)
			return err
		},
		rootfs: busyboxRootfs,
		layer:  agentUser,
		changes: []string{
			"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"WORKDIR /workspace",
			`CMD ["/bin/sh"]`,
		},
	})
}

// busyboxCandidates are where Debian's busybox-static installs the binary.
var busyboxCandidates = []string{"/bin/busybox", "/usr/bin/busybox"}

// BusyboxPath is the host's static busybox, the one binary of the busybox
// image (`rollout bench sandbox` spawns it on the host as the machine's
// own floor under every exec round trip).
func BusyboxPath() (string, error) { return findBusybox() }

// findBusybox returns the path of a statically linked busybox on this host.
// The dynamic one from Debian's `busybox` package would not run FROM
// scratch, so it is rejected rather than copied.
func findBusybox() (string, error) {
	var reasons []string
	for _, p := range busyboxCandidates {
		err := checkStatic(p)
		if err == nil {
			return p, nil
		}
		reasons = append(reasons, err.Error())
	}
	return "", fmt.Errorf("%w: no static busybox found (%s); install it with `sudo apt-get install busybox-static`", ErrMissingTool, strings.Join(reasons, "; "))
}

func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %v", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", p)
		}
	}
	return nil
}

// ensureBusybox finds the static busybox, installing busybox-static with
// apt-get when it is missing and we are root.
func ensureBusybox(ctx context.Context, log io.Writer) (string, error) {
	p, err := findBusybox()
	if err == nil || os.Geteuid() != 0 {
		return p, err
	}
	if err := aptInstall(ctx, log, "busybox-static"); err != nil {
		return "", err
	}
	return findBusybox()
}

// busyboxSpec hashes the binary itself: a new busybox-static version is a
// new image.
func busyboxSpec(context.Context) (string, error) {
	p, err := findBusybox()
	if err != nil {
		return "", err
	}
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("read busybox: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read busybox %s: %w", p, err)
	}
	return "busybox-static sha256=" + hex.EncodeToString(h.Sum(nil)) + " layout=list-full,tmp1777,root-only-passwd", nil
}

// busyboxRootfs writes a FROM-scratch tree: the binary, one symlink per
// applet at the path busybox itself reports, and the minimum of /etc.
func busyboxRootfs(ctx context.Context, w io.Writer, log io.Writer) error {
	p, err := ensureBusybox(ctx, log)
	if err != nil {
		return err
	}
	bin, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("read busybox: %w", err)
	}
	out, err := exec.CommandContext(ctx, p, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("list busybox applets: %w", err)
	}
	applets := strings.Fields(string(out))
	return writeBusyboxTree(w, bin, applets)
}

func writeBusyboxTree(w io.Writer, bin []byte, applets []string) error {
	tw := tar.NewWriter(w)
	dirs := map[string]int64{
		"bin": 0o755, "sbin": 0o755, "usr": 0o755, "usr/bin": 0o755, "usr/sbin": 0o755,
		"etc": 0o755, "root": 0o700, "home": 0o755, "tmp": 0o1777, "var": 0o755, "var/tmp": 0o1777,
		"proc": 0o555, "sys": 0o555, "dev": 0o755,
	}
	links := map[string]bool{"bin/sh": true}
	for _, a := range applets {
		a = cleanName(a)
		if a == "" || a == "." || a == "bin/busybox" || strings.Contains(a, "..") {
			continue
		}
		links[a] = true
		for d := path.Dir(a); d != "."; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	dirNames := make([]string, 0, len(dirs))
	for d := range dirs {
		dirNames = append(dirNames, d)
	}
	sort.Strings(dirNames) // parents sort before children
	for _, d := range dirNames {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: dirs[d], ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("write busybox tree: %w", err)
		}
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"bin/busybox", 0o755, bin},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{"etc/group", 0o644, []byte("root:x:0:\n")},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("write busybox tree: %w", err)
		}
		if _, err := io.Copy(tw, bytes.NewReader(f.data)); err != nil {
			return fmt.Errorf("write busybox tree: %w", err)
		}
	}
	linkNames := make([]string, 0, len(links))
	for l := range links {
		linkNames = append(linkNames, l)
	}
	sort.Strings(linkNames)
	for _, l := range linkNames {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: l, Linkname: "/bin/busybox", Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("write busybox tree: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write busybox tree: %w", err)
	}
	return nil
}
