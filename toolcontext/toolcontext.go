package toolcontext

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/internal/util/tartree"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

// ErrReward marks a reward function that failed or panicked.
var ErrReward = errors.New("reward function failed")

// ToolContext is the reward function's handle on a rollout's sandbox: the
// same sandbox, the same shell session (cwd and exported variables) and the
// same tool runtime the agent used.
//
// The ToolContext does not own the sandbox's lifetime: whoever created the
// sandbox closes it after the reward — use RunReward, which guarantees the
// Close even when the reward returns an error or panics.
type ToolContext struct {
	rt  *tools.Runtime
	set *tools.Set
}

// New binds a ToolContext to a rollout's tool runtime. set is the tool
// set CallTool may use; nil means every built-in tool.
func New(rt *tools.Runtime, set *tools.Set) (*ToolContext, error) {
	if rt == nil || rt.Sandbox == nil {
		return nil, errors.New("toolcontext: no sandbox")
	}
	if set == nil {
		s, err := tools.Default().Resolve(nil, nil)
		if err != nil {
			return nil, fmt.Errorf("toolcontext: %w", err)
		}
		set = s
	}
	return &ToolContext{rt: rt, set: set}, nil
}

// Sandbox returns the underlying sandbox.
func (tc *ToolContext) Sandbox() sandbox.Sandbox { return tc.rt.Sandbox }

// Runtime returns the rollout's tool runtime (todo list, session facts).
func (tc *ToolContext) Runtime() *tools.Runtime { return tc.rt }

// TerminalResult is the outcome of a Terminal command.
type TerminalResult struct {
	Output   string `json:"output"` // stdout and stderr merged, ANSI stripped
	ExitCode int    `json:"exit_code"`
	TimedOut bool   `json:"timed_out"` // ExitCode is 124
}

// Terminal runs cmd in the agent's shell session, so it starts in the
// directory the agent left and sees its exported variables. Unlike the
// model-facing terminal tool there is no 600 s cap and no 50,000-char cut
// (the sandbox's own output cap still applies); timeout 0 means 180 s.
func (tc *ToolContext) Terminal(ctx context.Context, cmd string, timeout time.Duration) (TerminalResult, error) {
	if timeout <= 0 {
		timeout = tools.DefaultTerminalTimeout
	}
	res, err := tc.rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Command: cmd, Shell: true, Timeout: timeout, MergeOutput: true, OutputCap: 16 << 20})
	if err != nil {
		return TerminalResult{}, fmt.Errorf("toolcontext terminal: %w", err)
	}
	out := strings.ToValidUTF8(string(res.Stdout)+string(res.Stderr), "\uFFFD")
	return TerminalResult{Output: tools.StripANSI(out), ExitCode: res.ExitCode, TimedOut: res.TimedOut}, nil
}

// Exec runs argv without a shell (nothing is interpolated).
func (tc *ToolContext) Exec(ctx context.Context, argv []string, timeout time.Duration) (sandbox.ExecResult, error) {
	res, err := tc.rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: argv, Timeout: timeout})
	if err != nil {
		return res, fmt.Errorf("toolcontext exec %q: %w", argv, err)
	}
	return res, nil
}

// ReadFile returns a file's bytes; relative paths are relative to the
// agent's current directory.
func (tc *ToolContext) ReadFile(ctx context.Context, p string) ([]byte, error) {
	abs, err := tc.rt.Resolve(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("toolcontext read %s: %w", p, err)
	}
	b, err := tc.rt.Sandbox.ReadFile(ctx, abs)
	if err != nil {
		return nil, fmt.Errorf("toolcontext read %s: %w", abs, err)
	}
	return b, nil
}

// WriteFile writes data (creating parent directories).
func (tc *ToolContext) WriteFile(ctx context.Context, p string, data []byte) error {
	abs, err := tc.rt.Resolve(ctx, p)
	if err != nil {
		return fmt.Errorf("toolcontext write %s: %w", p, err)
	}
	if err := tc.mkdir(ctx, path.Dir(abs)); err != nil {
		return err
	}
	if err := tc.rt.Sandbox.WriteFile(ctx, abs, data, 0o644); err != nil {
		return fmt.Errorf("toolcontext write %s: %w", abs, err)
	}
	return nil
}

func (tc *ToolContext) mkdir(ctx context.Context, dir string) error {
	res, err := tc.rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"mkdir", "-p", "--", dir}, Timeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("toolcontext mkdir %s: %w", dir, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("toolcontext mkdir %s: exit %d: %s", dir, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}

// UploadFile copies a local file into the sandbox at remote, byte for
// byte and keeping its mode, through the sandbox's tar channel.
func (tc *ToolContext) UploadFile(ctx context.Context, local, remote string) error {
	abs, err := tc.rt.Resolve(ctx, remote)
	if err != nil {
		return fmt.Errorf("toolcontext upload %s: %w", remote, err)
	}
	f, err := os.Open(local)
	if err != nil {
		return fmt.Errorf("toolcontext upload: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("toolcontext upload: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("toolcontext upload: %s is not a regular file", local)
	}
	if err := tc.mkdir(ctx, path.Dir(abs)); err != nil {
		return err
	}
	return tc.upload(ctx, path.Dir(abs), func(tw *tar.Writer) error {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: path.Base(abs), Size: st.Size(), Mode: int64(st.Mode().Perm()), ModTime: st.ModTime()}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := io.Copy(tw, f)
		return err
	})
}

// UploadDir copies a local directory tree into remoteDir (created if
// needed): regular files, directories and symlinks, modes kept.
func (tc *ToolContext) UploadDir(ctx context.Context, localDir, remoteDir string) error {
	abs, err := tc.rt.Resolve(ctx, remoteDir)
	if err != nil {
		return fmt.Errorf("toolcontext upload %s: %w", remoteDir, err)
	}
	st, err := os.Stat(localDir)
	if err != nil {
		return fmt.Errorf("toolcontext upload: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("toolcontext upload: %s is not a directory", localDir)
	}
	if err := tc.mkdir(ctx, abs); err != nil {
		return err
	}
	// The host's owner ids mean nothing in the sandbox.
	return tc.upload(ctx, abs, func(tw *tar.Writer) error {
		return tartree.Write(ctx, tw, localDir, false)
	})
}

// upload streams a tar produced by write into dir.
func (tc *ToolContext) upload(ctx context.Context, dir string, write func(*tar.Writer) error) error {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tw := tar.NewWriter(pw)
		err := write(tw)
		if cerr := tw.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err)
	}()
	err := tc.rt.Sandbox.Upload(ctx, dir, pr)
	// Unblock the writer if Upload returned early, and wait for it.
	pr.CloseWithError(errors.New("upload ended"))
	<-done
	if err != nil {
		return fmt.Errorf("toolcontext upload to %s: %w", dir, err)
	}
	return nil
}

// DownloadFile copies a file out of the sandbox to local (parents
// created), byte for byte.
func (tc *ToolContext) DownloadFile(ctx context.Context, remote, local string) error {
	data, err := tc.ReadFile(ctx, remote)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		return fmt.Errorf("toolcontext download: %w", err)
	}
	if err := os.WriteFile(local, data, 0o644); err != nil {
		return fmt.Errorf("toolcontext download: %w", err)
	}
	return nil
}

// DownloadDir copies a sandbox directory tree into localDir. Entries that
// would land outside localDir are refused.
func (tc *ToolContext) DownloadDir(ctx context.Context, remoteDir, localDir string) error {
	abs, err := tc.rt.Resolve(ctx, remoteDir)
	if err != nil {
		return fmt.Errorf("toolcontext download %s: %w", remoteDir, err)
	}
	if err := os.MkdirAll(localDir, 0o755); err != nil {
		return fmt.Errorf("toolcontext download: %w", err)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := extract(pr, localDir)
		// On a bad archive, stop the download instead of leaving it blocked
		// on a pipe nobody reads.
		pr.CloseWithError(err)
		done <- err
	}()
	derr := tc.rt.Sandbox.Download(ctx, abs, pw)
	pw.CloseWithError(derr)
	xerr := <-done
	if derr != nil {
		return fmt.Errorf("toolcontext download %s: %w", abs, derr)
	}
	if xerr != nil {
		return fmt.Errorf("toolcontext download %s: %w", abs, xerr)
	}
	return nil
}

func extract(r io.Reader, dest string) error {
	tr := tar.NewReader(r)
	root, err := filepath.Abs(dest)
	if err != nil {
		return err
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			_, _ = io.Copy(io.Discard, r) // drain trailing padding so the writer never blocks
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		name := path.Clean("/" + hdr.Name)
		target := filepath.Join(root, filepath.FromSlash(name))
		if target != root && !strings.HasPrefix(target, root+string(filepath.Separator)) {
			return fmt.Errorf("tar entry %q escapes the destination", hdr.Name)
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode|0o200)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			dst := path.Join(path.Dir(strings.TrimPrefix(name, "/")), hdr.Linkname)
			if path.IsAbs(hdr.Linkname) || dst == ".." || strings.HasPrefix(dst, "../") {
				continue // a link out of the tree would let later entries escape
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			_ = os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		}
	}
}

// Search runs the search_files tool (content search for pattern under
// path) and returns its JSON result decoded.
func (tc *ToolContext) Search(ctx context.Context, pattern, p string) (map[string]any, error) {
	args, _ := json.Marshal(map[string]any{"pattern": pattern, "path": p, "limit": 1000})
	out, err := tc.CallTool(ctx, "search_files", string(args))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		return nil, fmt.Errorf("toolcontext search: result is not JSON: %w", err)
	}
	return m, nil
}

// CallTool runs any tool of the set with JSON arguments and returns its
// result string (what the model would have seen, before result budgets).
// An invalid call returns the explanatory result and an error wrapping
// *tools.InvalidCallError; a dead sandbox returns the infra error.
func (tc *ToolContext) CallTool(ctx context.Context, name, argsJSON string) (string, error) {
	call, err := tc.set.Prepare("reward", name, argsJSON)
	if err != nil {
		var ic *tools.InvalidCallError
		if errors.As(err, &ic) {
			return ic.Result, fmt.Errorf("toolcontext call %s: %w", name, err)
		}
		return "", fmt.Errorf("toolcontext call %s: %w", name, err)
	}
	out, err := tc.set.Execute(ctx, tc.rt, call)
	if err != nil {
		return "", fmt.Errorf("toolcontext call %s: %w", name, err)
	}
	return out.Content, nil
}

// KillProcesses stops the rollout's background processes. When the
// sandbox can (sandbox.Quiescer, as Docker sandboxes do), it stops every
// process the agent left, not only those the process tool tracks:
// `nohup … &`, daemons and setsid'd children too.
func (tc *ToolContext) KillProcesses(ctx context.Context) error {
	if q, ok := tc.rt.Sandbox.(sandbox.Quiescer); ok {
		if _, err := q.KillAll(ctx); err != nil {
			return fmt.Errorf("toolcontext kill processes: %w", err)
		}
		return nil
	}
	ps, err := tc.rt.Sandbox.Processes(ctx)
	if err != nil {
		return fmt.Errorf("toolcontext list processes: %w", err)
	}
	var errs []error
	for _, p := range ps {
		if p.Running {
			if err := tc.rt.Sandbox.Kill(ctx, p.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				errs = append(errs, fmt.Errorf("kill %s: %w", p.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}

// RunReward runs fn with tc and then tears the sandbox down, whatever
// happened: an error or a panic in fn, or a cancelled ctx (the teardown
// runs on a context detached from ctx, bounded by closeTimeout, default
// 60 s). A panic becomes an error wrapping ErrReward.
func RunReward[T any](ctx context.Context, tc *ToolContext, closeTimeout time.Duration, fn func(context.Context, *ToolContext) (T, error)) (out T, err error) {
	if closeTimeout <= 0 {
		closeTimeout = 60 * time.Second
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: panic: %v\n%s", ErrReward, r, debug.Stack())
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = tc.KillProcesses(cctx)
		if cerr := tc.rt.Sandbox.Close(cctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close sandbox %s: %w", tc.rt.Sandbox.ID(), cerr))
		}
	}()
	out, err = fn(ctx, tc)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrReward, err)
	}
	return out, err
}
