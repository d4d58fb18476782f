// Package llamacpptest starts a real llama.cpp server for tests: llama-server
// from the image rollout-llamacpp:sid serving the project's tiny
// random-weight Qwen3 GGUF (docs/real-engines.md), in a labelled container
// whose port is published on 127.0.0.1, removed when the test ends.
//
// Without a Docker engine or without the image, Start skips the test with a
// message saying what is missing, unless the environment variable CI is
// "true": then it fails, so CI never passes by skipping the real-engine
// suite. `make test` builds the image first (`rollout sandbox image build
// --name llamacpp`).
package llamacpptest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/devtools/engine"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
)

// Options tune Start; the zero value is the image's defaults: -c 32768,
// -np 4 (8192 tokens per slot), -t 1.
type Options struct {
	// Ctx, Slots and Threads are llama-server's -c, -np and -t.
	Ctx, Slots, Threads int
	// ExtraArgs are appended to llama-server's command line.
	ExtraArgs []string
	// PrefillAssistant starts llama-server without --no-prefill-assistant
	// (its default: a trailing assistant message is a prefill).
	PrefillAssistant bool
	// Image overrides rollout-llamacpp:sid.
	Image string
}

// Engine is a running llama-server.
type Engine struct {
	// URL is the base URL, e.g. http://127.0.0.1:49160; the OpenAI routes
	// are under URL + "/v1".
	URL string
	// ID is the container ID; Args llama-server's command line.
	ID   string
	Args []string

	e   *engine.Engine
	cli *client.Client
}

// Call sends body as JSON to route (GET when body is nil) and decodes a
// 200 answer into out (when non-nil). It returns the status and the raw
// body; transport errors fail the test.
func (e *Engine) Call(t testing.TB, route string, body, out any) (int, []byte) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatalf("llamacpptest: %s: encode: %v", route, err)
		}
		method, rd = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.URL+route, rd)
	if err != nil {
		t.Fatalf("llamacpptest: %s: %v", route, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("llamacpptest: %s: %v", route, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("llamacpptest: %s: read: %v", route, err)
	}
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("llamacpptest: %s: decode %s: %v", route, raw, err)
		}
	}
	return resp.StatusCode, raw
}

// MustCall is Call that fails the test (with the server's log tail) unless
// the answer is 200.
func (e *Engine) MustCall(t testing.TB, route string, body, out any) {
	t.Helper()
	if code, raw := e.Call(t, route, body, out); code != http.StatusOK {
		t.Fatalf("llamacpptest: %s: HTTP %d: %s\nserver log:\n%s", route, code, raw, e.LogTail(20))
	}
}

// Tokenize returns the server's token ids for text, special tokens parsed
// and no BOS added: what a rendered chat prompt is made of.
func (e *Engine) Tokenize(t testing.TB, text string) []int {
	t.Helper()
	var r struct {
		Tokens []int `json:"tokens"`
	}
	e.MustCall(t, "/tokenize", map[string]any{"content": text, "add_special": false, "parse_special": true}, &r)
	return r.Tokens
}

// CopyFile copies the regular file at src inside the container into
// dir on the host and returns the host path (dir joined with the file's
// base name); failures fail the test.
func (e *Engine) CopyFile(t testing.TB, src, dir string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := e.cli.CopyFromContainer(ctx, e.ID, client.CopyFromContainerOptions{SourcePath: src})
	if err != nil {
		t.Fatalf("llamacpptest: copy %s out of the container: %v", src, err)
	}
	defer res.Content.Close()
	out, err := untarFile(res.Content, src, dir)
	if err != nil {
		t.Fatalf("llamacpptest: copy %s out of the container: %v", src, err)
	}
	return out
}

// CopyFileIn copies the host file at hostPath into the directory dir
// inside the container and returns its path there; failures fail the
// test.
func (e *Engine) CopyFileIn(t testing.TB, hostPath, dir string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	archive, err := tarFile(hostPath)
	if err != nil {
		t.Fatalf("llamacpptest: copy %s into the container: %v", hostPath, err)
	}
	_, err = e.cli.CopyToContainer(ctx, e.ID, client.CopyToContainerOptions{DestinationPath: dir, Content: bytes.NewReader(archive)})
	if err != nil {
		t.Fatalf("llamacpptest: copy %s into the container: %v", hostPath, err)
	}
	return path.Join(dir, filepath.Base(hostPath))
}

// tarFile returns a tar archive holding the file at p under its base
// name.
func tarFile(p string) ([]byte, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h := &tar.Header{Name: filepath.Base(p), Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Now()}
	if err := tw.WriteHeader(h); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Serve starts a second llama-server in the engine's container, serving
// model (a path inside the container, e.g. from CopyFileIn) on port, and
// returns once its /health answers ok. Its URL is on the container's own
// address (the port is not published), so the host must reach the
// container network, as it does with a local Linux Docker engine; when it
// cannot, the test is skipped (failed under CI=true). The server goes
// with the container. Only URL and Call/MustCall/Tokenize are meaningful
// on the result. extra is appended to its command line.
func (e *Engine) Serve(t testing.TB, model string, port int, extra ...string) *Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ip, err := e.containerIP(ctx)
	if err != nil {
		t.Fatalf("llamacpptest: %v", err)
	}
	cmd := append([]string{"llama-server", "-m", model, "--host", "0.0.0.0", "--port", fmt.Sprint(port), "-t", "1", "-c", "2048", "-np", "1"}, extra...)
	ex, err := e.cli.ExecCreate(ctx, e.ID, client.ExecCreateOptions{Cmd: cmd})
	if err != nil {
		t.Fatalf("llamacpptest: exec %v: %v", cmd, err)
	}
	if _, err := e.cli.ExecStart(ctx, ex.ID, client.ExecStartOptions{Detach: true}); err != nil {
		t.Fatalf("llamacpptest: exec %v: %v", cmd, err)
	}
	second := &Engine{URL: fmt.Sprintf("http://%s", net.JoinHostPort(ip, fmt.Sprint(port))), ID: e.ID, Args: cmd, e: e.e, cli: e.cli}
	if err := second.waitHealthy(ctx); err != nil {
		skipOrFail(t, "second llama-server at %s (%v) not reachable from the host: %v", second.URL, cmd, err)
	}
	return second
}

// containerIP returns the container's address on its (first) network.
func (e *Engine) containerIP(ctx context.Context) (string, error) {
	res, err := e.cli.ContainerInspect(ctx, e.ID, client.ContainerInspectOptions{})
	if err != nil {
		return "", err
	}
	if ns := res.Container.NetworkSettings; ns != nil {
		for _, ep := range ns.Networks {
			if ep != nil && ep.IPAddress.IsValid() {
				return ep.IPAddress.String(), nil
			}
		}
	}
	return "", errors.New("the container has no network address")
}

// waitHealthy polls /health until it answers 200.
func (e *Engine) waitHealthy(ctx context.Context) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		resp, err := hc.Get(e.URL + "/health")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// untarFile writes the first regular file of the tar stream r into dir
// under the base name of src.
func untarFile(r io.Reader, src, dir string) (string, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", fmt.Errorf("no regular file in the archive: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		out := filepath.Join(dir, filepath.Base(src))
		f, err := os.Create(out)
		if err != nil {
			return "", err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return "", err
		}
		return out, f.Close()
	}
}

// LogTail returns the last n lines of the server's log, for failure
// messages.
func (e *Engine) LogTail(n int) string { return e.e.LogTail(context.Background(), n) }

// Start runs llama-server for the duration of the test (t.Cleanup removes
// the container) and returns once /health answers ok.
func Start(t testing.TB, opts Options) *Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		skipOrFail(t, "no Docker engine for the llama.cpp engine: %v", err)
		return nil
	}
	e, err := engine.StartLlamacpp(ctx, cli, engine.LlamacppOptions{
		Image: opts.Image, Ctx: opts.Ctx, Slots: opts.Slots, Threads: opts.Threads,
		ExtraArgs: opts.ExtraArgs, PrefillAssistant: opts.PrefillAssistant, Owner: "test",
		Labels: map[string]string{"io.rollout.engine.test": t.Name()},
	})
	if err != nil {
		_ = cli.Close()
		if errors.Is(err, engine.ErrImageMissing) {
			skipOrFail(t, "%v", err)
			return nil
		}
		t.Fatalf("llamacpptest: %v", err)
		return nil
	}
	t.Cleanup(func() {
		defer cli.Close()
		if err := e.Stop(context.Background()); err != nil {
			t.Errorf("llamacpptest: %v", err)
		}
	})
	return &Engine{URL: e.URL, ID: e.ID, Args: e.Args, e: e, cli: cli}
}

// InCI reports whether the environment says this is CI (CI=true), where a
// missing engine is a failure rather than a skip.
func InCI() bool { return os.Getenv("CI") == "true" }

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("llamacpptest (CI=true, so not skipped): "+format, args...)
	}
	t.Skipf("llamacpptest: skipped: "+format, args...)
}

// compile-time check that the Docker client satisfies what engine needs.
var _ engine.API = (*client.Client)(nil)
