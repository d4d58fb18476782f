// Package engine starts a real inference engine in a local Docker container
// for tests and for users: llama.cpp's llama-server from the image
// rollout-llamacpp:sid (package sandbox/image, recipe "llamacpp") serving
// the project's tiny random-weight Qwen3 GGUF.
//
// An engine container is not a sandbox: it has the default network, its
// port is published on loopback with an ephemeral host port unless one is
// given, and it carries the io.rollout.engine labels rather than the
// sandbox's io.rollout.managed, so the sandbox reaper never touches it.
// See docs/real-engines.md.
package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/sandbox/image"
)

// Labels on every engine container.
const (
	// LabelEngine names the engine ("llamacpp").
	LabelEngine = "io.rollout.engine"
	// LabelOwner says who started it: "test" (package llamacpptest) or
	// "cli" (`rollout engine llamacpp`), plus the pid.
	LabelOwner = "io.rollout.engine.owner"
)

// ErrImageMissing: the engine image is not present locally; the message
// says how to build it.
var ErrImageMissing = errors.New("engine image not present")

// ErrNotReady: the engine exited or did not answer /health in time; the
// message carries the tail of its log.
var ErrNotReady = errors.New("engine not ready")

// API is the part of the Engine API this package uses.
type API interface {
	ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ContainerCreate(ctx context.Context, opts client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerStart(ctx context.Context, id string, opts client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerInspect(ctx context.Context, id string, opts client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerLogs(ctx context.Context, id string, opts client.ContainerLogsOptions) (client.ContainerLogsResult, error)
	ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
}

var _ API = (*client.Client)(nil)

// LlamacppOptions configure StartLlamacpp. Zero values take the defaults.
type LlamacppOptions struct {
	// Image defaults to image.Ref("llamacpp") (rollout-llamacpp:sid).
	Image string
	// Model is the GGUF path inside the container (default
	// image.LlamacppModel).
	Model string
	// Ctx is llama-server's -c, the total context split over the slots
	// (default 32768); Slots is -np (default 4); Threads is -t (default 1).
	Ctx, Slots, Threads int
	// HostIP and HostPort are where the port is published (default
	// 127.0.0.1 and an ephemeral port chosen by the engine).
	HostIP   string
	HostPort int
	// ExtraArgs are appended to llama-server's command line.
	ExtraArgs []string
	// PrefillAssistant leaves llama-server's own default, under which a
	// trailing assistant message is a prefill to continue: the command
	// line then lacks --no-prefill-assistant, as a server started by hand
	// would (tests of rollout against such a server).
	PrefillAssistant bool
	// Name is the container name (default: the engine picks one).
	Name string
	// Owner goes into the io.rollout.engine.owner label (default "cli").
	Owner string
	// Labels are added to the container.
	Labels map[string]string
	// ReadyTimeout bounds the wait for /health (default 2 minutes).
	ReadyTimeout time.Duration
}

// Engine is one running engine container.
type Engine struct {
	// URL is the server's base URL on the host, e.g. http://127.0.0.1:49160
	// (no trailing slash; the OpenAI routes are under URL + "/v1").
	URL string
	// ID is the container ID; Image the image reference it runs.
	ID, Image string
	// Args is llama-server's full command line in the container.
	Args []string

	cli API
}

// LlamacppArgs is the llama-server command line for opts.
func LlamacppArgs(opts LlamacppOptions) []string {
	opts = opts.withDefaults()
	args := []string{"llama-server", "-m", opts.Model, "--jinja", "--no-prefill-assistant"}
	if opts.PrefillAssistant {
		args = args[:len(args)-1]
	}
	args = append(args, "--host", "0.0.0.0", "--port", strconv.Itoa(image.LlamacppPort),
		"-t", strconv.Itoa(opts.Threads), "-c", strconv.Itoa(opts.Ctx), "-np", strconv.Itoa(opts.Slots))
	return append(args, opts.ExtraArgs...)
}

func (o LlamacppOptions) withDefaults() LlamacppOptions {
	if o.Image == "" {
		o.Image = image.Ref("llamacpp")
	}
	if o.Model == "" {
		o.Model = image.LlamacppModel
	}
	if o.Ctx == 0 {
		o.Ctx = 32768
	}
	if o.Slots == 0 {
		o.Slots = 4
	}
	if o.Threads == 0 {
		o.Threads = 1
	}
	if o.HostIP == "" {
		o.HostIP = "127.0.0.1"
	}
	if o.Owner == "" {
		o.Owner = "cli"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	return o
}

func (o LlamacppOptions) validate() error {
	switch {
	case o.Ctx < 0 || o.Slots < 0 || o.Threads < 0:
		return fmt.Errorf("ctx, slots and threads must be positive (got %d, %d, %d)", o.Ctx, o.Slots, o.Threads)
	case o.HostPort < 0 || o.HostPort > 65535:
		return fmt.Errorf("host port %d out of range", o.HostPort)
	case o.Slots > 0 && o.Ctx > 0 && o.Ctx/o.Slots < 256:
		return fmt.Errorf("context %d over %d slots leaves %d tokens per slot: too small", o.Ctx, o.Slots, o.Ctx/o.Slots)
	}
	if o.HostIP != "" {
		if _, err := netip.ParseAddr(o.HostIP); err != nil {
			return fmt.Errorf("host ip %q: %v", o.HostIP, err)
		}
	}
	return nil
}

// StartLlamacpp starts llama-server in a container from the engine image,
// publishes its port and waits until /health answers ok. On any error the
// container is removed. The caller owns the engine and must Stop it.
func StartLlamacpp(ctx context.Context, cli API, opts LlamacppOptions) (*Engine, error) {
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("start llama-server: %w", err)
	}
	opts = opts.withDefaults()
	if _, err := cli.ImageInspect(ctx, opts.Image); err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("%w: %s: build it with `rollout sandbox image build --name llamacpp` (about a minute; see docs/real-engines.md)", ErrImageMissing, opts.Image)
		}
		return nil, fmt.Errorf("inspect image %s: %w", opts.Image, err)
	}
	hostIP, _ := netip.ParseAddr(opts.HostIP)
	port := network.MustParsePort(strconv.Itoa(image.LlamacppPort) + "/tcp")
	hostPort := ""
	if opts.HostPort != 0 {
		hostPort = strconv.Itoa(opts.HostPort)
	}
	labels := map[string]string{}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	labels[LabelEngine] = "llamacpp"
	labels[LabelOwner] = fmt.Sprintf("%s:%d", opts.Owner, os.Getpid())
	args := LlamacppArgs(opts)
	cfg := &container.Config{
		Image:        opts.Image,
		Cmd:          args,
		Labels:       labels,
		ExposedPorts: network.PortSet{port: {}},
	}
	hc := &container.HostConfig{
		PortBindings: network.PortMap{port: {{HostIP: hostIP, HostPort: hostPort}}},
		Init:         boolPtr(true),
	}
	res, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: cfg, HostConfig: hc, Name: opts.Name})
	if err != nil {
		return nil, fmt.Errorf("create llama-server container: %w", err)
	}
	e := &Engine{ID: res.ID, Image: opts.Image, Args: args, cli: cli}
	ok := false
	defer func() {
		if !ok {
			_ = e.Stop(context.WithoutCancel(ctx))
		}
	}()
	if _, err := cli.ContainerStart(ctx, e.ID, client.ContainerStartOptions{}); err != nil {
		return nil, fmt.Errorf("start llama-server container: %w", err)
	}
	ins, err := cli.ContainerInspect(ctx, e.ID, client.ContainerInspectOptions{})
	if err != nil {
		return nil, fmt.Errorf("inspect llama-server container: %w", err)
	}
	addr, err := publishedAddr(ins.Container, port)
	if err != nil {
		return nil, err
	}
	e.URL = "http://" + addr
	if err := e.waitReady(ctx, opts.ReadyTimeout); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

func boolPtr(b bool) *bool { return &b }

func publishedAddr(c container.InspectResponse, port network.Port) (string, error) {
	if c.NetworkSettings == nil {
		return "", fmt.Errorf("llama-server container %s: no network settings", shortID(c.ID))
	}
	for _, b := range c.NetworkSettings.Ports[port] {
		if b.HostPort == "" {
			continue
		}
		ip := b.HostIP
		if !ip.IsValid() || ip.IsUnspecified() {
			ip = netip.MustParseAddr("127.0.0.1")
		}
		return net.JoinHostPort(ip.String(), b.HostPort), nil
	}
	return "", fmt.Errorf("llama-server container %s: port %s is not published", shortID(c.ID), port)
}

// waitReady polls /health until it answers 200 {"status":"ok"}, failing
// early with the log tail when the container exits.
func (e *Engine) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// No keep-alive: no idle connection (and its goroutines) outlives the
	// wait, which goleak-checked test packages would report.
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last string
	for {
		ok, why := health(ctx, hc, e.URL)
		if ok {
			return nil
		}
		last = why
		ins, err := e.cli.ContainerInspect(ctx, e.ID, client.ContainerInspectOptions{})
		if err == nil && ins.Container.State != nil && !ins.Container.State.Running {
			return fmt.Errorf("%w: llama-server exited with code %d before it was ready:\n%s", ErrNotReady, ins.Container.State.ExitCode, e.LogTail(context.WithoutCancel(ctx), 30))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: no healthy answer from %s/health within %s (last: %s):\n%s", ErrNotReady, e.URL, timeout, last, e.LogTail(context.WithoutCancel(ctx), 30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func health(ctx context.Context, hc *http.Client, base string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var h struct {
		Status string `json:"status"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &h) == nil && h.Status == "ok" {
		return true, ""
	}
	return false, fmt.Sprintf("HTTP %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
}

// LogTail returns the last n lines of the container's output (stdout and
// stderr interleaved as far as the engine keeps them), or a note saying
// why it could not be read.
func (e *Engine) LogTail(ctx context.Context, n int) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rc, err := e.cli.ContainerLogs(ctx, e.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: strconv.Itoa(n)})
	if err != nil {
		return fmt.Sprintf("(logs unavailable: %v)", err)
	}
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := stdcopy.StdCopy(&buf, &buf, io.LimitReader(rc, 1<<20)); err != nil {
		return fmt.Sprintf("%s\n(reading logs: %v)", buf.String(), err)
	}
	return strings.TrimRight(buf.String(), "\n")
}

// Stop removes the container (killing llama-server). It is safe to call
// more than once; a container already gone is not an error.
func (e *Engine) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err := e.cli.ContainerRemove(ctx, e.ID, client.ContainerRemoveOptions{Force: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove llama-server container %s: %w", shortID(e.ID), err)
	}
	return nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
