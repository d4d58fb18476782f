package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

func TestExec(t *testing.T) {
	sandboxtest.ExecTable(t, newSandbox(t, sandbox.Spec{Env: map[string]string{"BASE": "b"}}))
}

func TestShellState(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	steps := []struct {
		cmd  string
		env  map[string]string
		want string
	}{
		{cmd: "mkdir -p sub/dir && cd sub/dir && export FOO='a b' && BAR=local", want: ""},
		{cmd: `pwd; echo "$FOO|$BAR"`, want: "/workspace/sub/dir\na b|\n"},
		{cmd: "echo $ONCE; cd /tmp", env: map[string]string{"ONCE": "1"}, want: "1\n"},
		{cmd: `pwd; echo "[$ONCE]"; export Q="it's"; exit 4`, want: "/tmp\n[]\n"},
		{cmd: `echo "$Q"`, want: "it's\n"},
	}
	for i, st := range steps {
		r, err := s.Exec(ctx, sandbox.ExecRequest{Command: st.cmd, Shell: true, Env: st.env})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if string(r.Stdout) != st.want {
			t.Fatalf("step %d: stdout %q, want %q (stderr %q)", i, r.Stdout, st.want, r.Stderr)
		}
	}
	// Non-shell commands are unaffected by the session.
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "pwd; echo \"[$FOO]\""})
	if err != nil || string(r.Stdout) != "/workspace\n[]\n" {
		t.Fatalf("plain command saw shell state: %q %v", r.Stdout, err)
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	// The command ignores SIGTERM and leaves a grandchild holding the pipe.
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: `trap "" TERM; echo started; sleep 1000 & sleep 1000`, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !r.TimedOut || r.ExitCode != 124 || string(r.Stdout) != "started\n" {
		t.Fatalf("result %+v stdout %q", r, r.Stdout)
	}
	ps, err := s.Exec(ctx, sandbox.ExecRequest{Command: "ps -o pid,comm | grep -c sleep", Shell: false})
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(ps.Stdout)) != "0" {
		t.Fatalf("sleep processes survived the timeout: %s", ps.Stdout)
	}
	// Shell commands time out the same way and keep the previous state.
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "cd /tmp", Shell: true}); err != nil {
		t.Fatal(err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "cd /; sleep 100", Shell: true, Timeout: 300 * time.Millisecond})
	if err != nil || !r.TimedOut {
		t.Fatalf("shell timeout: %+v %v", r, err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "pwd", Shell: true})
	if err != nil || string(r.Stdout) != "/tmp\n" {
		t.Fatalf("after timeout: %q %v", r.Stdout, err)
	}
}

func TestExecCancel(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 1000"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	// The agent killed and reaped it before the cancelled call returned:
	// the sandbox stays usable and the very next call finds nothing left
	// (before the call waited for the agent's answer, a CI run once listed
	// the dying sleep here).
	for i := range 20 {
		r, err := s.Exec(context.Background(), sandbox.ExecRequest{Command: "ps -o comm | grep -c sleep"})
		if err != nil || strings.TrimSpace(string(r.Stdout)) != "0" {
			t.Fatalf("after cancel %d: %q %v", i, r.Stdout, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err = s.Exec(ctx, sandbox.ExecRequest{Command: "for i in 1 2 3 4 5 6 7 8; do sleep 1000 & done; wait"})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cancel %d: err = %v, want deadline exceeded", i, err)
		}
	}
}

func TestFiles(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	big := make([]byte, 10<<20)
	_, _ = rand.Read(big)
	if err := s.WriteFile(ctx, "/workspace/d/big.bin", big, 0o751); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadFile(ctx, "/workspace/d/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("10 MB round trip differs (got %d bytes)", len(got))
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "stat -c '%a %u' /workspace/d/big.bin 2>/dev/null || ls -ln /workspace/d/big.bin"})
	if err != nil {
		t.Fatal(err)
	}
	if out := string(r.Stdout); !strings.Contains(out, "751 1000") && !strings.HasPrefix(out, "-rwxr-x--x") {
		t.Errorf("mode/owner: %q", out)
	}
	if _, err := s.ReadFile(ctx, "/workspace/missing"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("missing file: %v", err)
	}
	if err := s.WriteFile(ctx, "relative", nil, 0); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("relative path: %v", err)
	}
	// The sandbox user cannot write where it has no permission, even
	// though the agent is root.
	if err := s.WriteFile(ctx, "/etc/passwd", []byte("x"), 0); !errors.Is(err, sandbox.ErrFailed) {
		t.Errorf("write /etc/passwd: %v, want ErrFailed", err)
	}
	// Empty file.
	if err := s.WriteFile(ctx, "/workspace/empty", nil, 0); err != nil {
		t.Fatal(err)
	}
	if b, err := s.ReadFile(ctx, "/workspace/empty"); err != nil || len(b) != 0 {
		t.Fatalf("empty: %q %v", b, err)
	}
}

func TestUploadDownload(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	payload := make([]byte, 3<<20)
	_, _ = rand.Read(payload)
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	files := map[string]struct {
		mode int64
		data []byte
	}{
		"bin/run.sh":    {0o755, []byte("#!/bin/sh\necho ran\n")},
		"data/blob.bin": {0o600, payload},
		"README":        {0o644, []byte("hi")},
	}
	_ = tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o750})
	for name, f := range files {
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: f.mode, Size: int64(len(f.data))})
		_, _ = tw.Write(f.data)
	}
	_ = tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "README"})
	_ = tw.Close()
	if err := s.Upload(ctx, "/workspace/proj", &in); err != nil {
		t.Fatal(err)
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "./bin/run.sh && cat link", Cwd: "/workspace/proj"})
	if err != nil || string(r.Stdout) != "ran\nhi" {
		t.Fatalf("uploaded script: %q %q %v", r.Stdout, r.Stderr, err)
	}
	var out bytes.Buffer
	if err := s.Download(ctx, "/workspace/proj", &out); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = true
		if f, ok := files[h.Name]; ok {
			data, _ := io.ReadAll(tr)
			if !bytes.Equal(data, f.data) || h.Mode&0o777 != f.mode {
				t.Errorf("%s: %d bytes mode %o, want %d bytes mode %o", h.Name, len(data), h.Mode, len(f.data), f.mode)
			}
		}
		if h.Name == "link" && h.Linkname != "README" {
			t.Errorf("symlink target %q", h.Linkname)
		}
		if h.Name == "bin/" && h.Mode&0o777 != 0o750 {
			t.Errorf("dir mode %o", h.Mode)
		}
	}
	for _, want := range []string{"bin/", "bin/run.sh", "data/blob.bin", "README", "link"} {
		if !seen[want] {
			t.Errorf("download lacks %s (has %v)", want, seen)
		}
	}
	// An entry escaping the target directory is refused.
	var bad bytes.Buffer
	tw = tar.NewWriter(&bad)
	_ = tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	if err := s.Upload(ctx, "/workspace/proj", &bad); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("escaping entry: %v", err)
	}
	if err := s.Download(ctx, "/workspace/nope", io.Discard); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("download missing dir: %v", err)
	}
}

func TestBackgroundProcesses(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	p, err := s.Start(ctx, sandbox.ExecRequest{Command: "while read l; do echo got:$l; done; echo bye; exit 7"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.ID, "proc_") || !p.Running || p.PID == 0 {
		t.Fatalf("start: %+v", p)
	}
	if err := s.WriteStdin(ctx, p.ID, []byte("one\ntwo\n")); err != nil {
		t.Fatal(err)
	}
	cs, ok := s.(sandbox.StdinCloser)
	if !ok {
		t.Fatal("docker sandbox has no CloseStdin")
	}
	if err := cs.CloseStdin(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	done, err := s.Wait(ctx, p.ID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if done.Running || done.ExitCode != 7 || string(done.Output) != "got:one\ngot:two\nbye\n" {
		t.Fatalf("wait: %+v %q", done, done.Output)
	}
	sl, err := s.Start(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Wait(ctx, sl.ID, 50*time.Millisecond)
	if err != nil || !w.Running {
		t.Fatalf("short wait: %+v %v", w, err)
	}
	if err := s.Kill(ctx, sl.ID); err != nil {
		t.Fatal(err)
	}
	w, err = s.Wait(ctx, sl.ID, 10*time.Second)
	if err != nil || w.Running || w.ExitCode != 137 {
		t.Fatalf("after kill: %+v %v", w, err)
	}
	list, err := s.Processes(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if _, err := s.Poll(ctx, "proc_nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("poll unknown: %v", err)
	}
	if err := s.WriteStdin(ctx, sl.ID, []byte("x")); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("stdin to exited process: %v", err)
	}
}

func TestIsolationDefaults(t *testing.T) {
	d := needDocker(t)
	s := newSandbox(t, sandbox.Spec{Labels: map[string]string{sandbox.LabelRollout: "r-1", sandbox.LabelRun: "run-1"}})
	ctx := context.Background()
	ins, err := d.Client().ContainerInspect(ctx, s.ID(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := ins.Container
	hc := c.HostConfig
	checks := map[string]bool{
		"network none":      string(hc.NetworkMode) == "none",
		"cap drop all":      len(hc.CapDrop) == 1 && hc.CapDrop[0] == "ALL",
		"no-new-privileges": len(hc.SecurityOpt) == 1 && hc.SecurityOpt[0] == "no-new-privileges",
		"init":              hc.Init != nil && *hc.Init,
		"pids limit":        hc.PidsLimit != nil && *hc.PidsLimit == sandbox.DefaultLimits.PIDs,
		"memory no swap":    hc.Memory == sandbox.DefaultLimits.MemoryBytes && hc.MemorySwap == hc.Memory,
		"cpu quota":         hc.NanoCPUs == int64(sandbox.DefaultLimits.CPUs*1e9),
		"log driver none":   hc.LogConfig.Type == "none",
		"managed label":     c.Config.Labels[sandbox.LabelManaged] == "true",
		"instance label":    c.Config.Labels[sandbox.LabelInstance] == d.Instance(),
		"rollout label":     c.Config.Labels[sandbox.LabelRollout] == "r-1",
		"run label":         c.Config.Labels[sandbox.LabelRun] == "run-1",
	}
	for name, ok := range checks {
		if !ok {
			t.Errorf("%s: not set (host config %+v)", name, hc)
		}
	}
	// Commands hold no capabilities at all.
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; grep NoNewPrivs /proc/self/status"})
	if err != nil {
		t.Fatal(err)
	}
	out := string(r.Stdout)
	if !strings.Contains(out, "CapEff:\t0000000000000000") || !strings.Contains(out, "CapPrm:\t0000000000000000") || !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("command privileges:\n%s", out)
	}
	// Bad specs are refused before anything is created.
	for _, spec := range []sandbox.Spec{
		{Image: ""},
		{Image: sandboxtest.Image, Network: "host"},
		{Image: sandboxtest.Image, Workdir: "rel"},
		{Image: sandboxtest.Image, Labels: map[string]string{sandbox.LabelInstance: "x"}},
		{Image: sandboxtest.Image, Limits: sandbox.Limits{PIDs: -1}},
		{Image: "rollout-no-such-image:x"},
	} {
		if _, err := d.Create(ctx, spec); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("spec %+v: err %v, want ErrInvalid", spec, err)
		}
	}
	// An explicit user that does not exist is a bad spec too.
	if _, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image, User: "nobody-here"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("unknown user: %v", err)
	}
}

func TestCloseIdempotentAndCancelled(t *testing.T) {
	d := needDocker(t)
	s, err := d.Create(context.Background(), sandbox.Spec{Image: sandboxtest.Image})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("close with cancelled ctx: %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := d.Client().ContainerInspect(context.Background(), s.ID(), client.ContainerInspectOptions{}); err == nil {
		t.Fatal("container still exists after Close")
	}
	if _, err := s.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("exec after close: %v", err)
	}
}

// TestConcurrentCalls multiplexes commands and transfers over one channel.
func TestConcurrentCalls(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	slow := make(chan error, 1)
	go func() {
		r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 2; echo slow"})
		if err == nil && string(r.Stdout) != "slow\n" {
			err = errors.New("slow command output " + string(r.Stdout))
		}
		slow <- err
	}()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			want := strings.Repeat(string(rune('a'+i)), 100000+i)
			path := "/workspace/f" + string(rune('a'+i))
			if err := s.WriteFile(ctx, path, []byte(want), 0); err != nil {
				t.Error(err)
				return
			}
			r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"wc", "-c", path}})
			if err != nil || !strings.HasPrefix(strings.TrimSpace(string(r.Stdout)), strconv.Itoa(len(want))) {
				t.Errorf("wc %s: %q %v", path, r.Stdout, err)
			}
			got, err := s.ReadFile(ctx, path)
			if err != nil || string(got) != want {
				t.Errorf("read %s: %d bytes %v", path, len(got), err)
			}
		})
	}
	wg.Wait()
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
}

func TestSpecFilesAndUser(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{Files: []sandbox.File{{Path: "/workspace/task/in.txt", Data: []byte("task"), Mode: 0o600}}, Workdir: "/srv/work"})
	ctx := context.Background()
	got, err := s.ReadFile(ctx, "/workspace/task/in.txt")
	if err != nil || string(got) != "task" {
		t.Fatalf("placed file: %q %v", got, err)
	}
	// A workdir missing from the image is created for the sandbox user.
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "pwd; touch mine && ls -ln mine | awk '{print $1, $3}'"})
	if err != nil || string(r.Stdout) != "/srv/work\n-rw-r--r-- 1000\n" {
		t.Fatalf("workdir: %q %q %v", r.Stdout, r.Stderr, err)
	}
	root := newSandbox(t, sandbox.Spec{User: "root"})
	r, err = root.Exec(ctx, sandbox.ExecRequest{Argv: []string{"id", "-u"}})
	if err != nil || string(r.Stdout) != "0\n" {
		t.Fatalf("explicit root user: %q %v", r.Stdout, err)
	}
}

// KillAll stops every process the sandbox user left, detached ones
// included, and the sandbox stays usable.
func TestKillAll(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	if _, err := s.Start(ctx, sandbox.ExecRequest{Command: "sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "setsid sleep 2000 </dev/null >/dev/null 2>&1 &"}); err != nil {
		t.Fatal(err)
	}
	n, err := s.(sandbox.Quiescer).KillAll(ctx)
	if err != nil || n < 2 {
		t.Fatalf("killed %d: %v", n, err)
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "ps -o comm | grep -c sleep"})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "0" {
		t.Fatalf("after KillAll: %q %v", r.Stdout, err)
	}
}

// The exec channel needs nothing from the image: a scratch image holding a
// single static binary — no shell, no /etc/passwd, no /tmp — still runs
// argv commands and file operations; shell commands fail with a clear
// exit 127, not a broken sandbox.
func TestBareImage(t *testing.T) {
	d := needDocker(t)
	ctx := context.Background()
	const ref = "rollout-sandbox-test:bare"
	if _, err := d.Client().ImageInspect(ctx, ref); err != nil {
		bb, err := os.ReadFile("/bin/busybox")
		if err != nil {
			t.Skipf("needs a static /bin/busybox: %v", err)
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: "busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb)), ModTime: time.Now()})
		_, _ = tw.Write(bb)
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		res, err := d.Client().ImageImport(ctx, client.ImageImportSource{Source: &buf, SourceName: "-"}, ref, client.ImageImportOptions{})
		if err != nil {
			t.Fatalf("import bare image: %v", err)
		}
		_, _ = io.Copy(io.Discard, res)
		res.Close()
	}
	s := newSandbox(t, sandbox.Spec{Image: ref, Workdir: "/"})
	r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/busybox", "echo", "hi"}})
	if err != nil || string(r.Stdout) != "hi\n" || r.ExitCode != 0 {
		t.Fatalf("argv exec: %+v %v", r, err)
	}
	if err := s.WriteFile(ctx, "/data/x.bin", []byte{0, 1, 2, 255}, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := s.ReadFile(ctx, "/data/x.bin"); err != nil || !bytes.Equal(b, []byte{0, 1, 2, 255}) {
		t.Fatalf("read back %v %v", b, err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "echo hi"})
	if err != nil || r.ExitCode != 127 {
		t.Fatalf("shell command without a shell: %+v %v", r, err)
	}
	if r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/busybox", "true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("sandbox broken after the failed shell command: %+v %v", r, err)
	}
}
