package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/agent"
)

// k8sSandbox is one sandbox pod with its agent channel.
type k8sSandbox struct {
	sandbox.ChannelOps
	k       *Kubernetes
	name    string
	claim   *claimRef // mode agent-sandbox
	node    string
	spec    sandbox.Spec
	imageID string
	Hello   agent.Hello
	created time.Time
	log     *slog.Logger
	stderr  *sandbox.TailBuffer

	cancel     context.CancelFunc
	streamDone chan struct{}
	stdin      *io.PipeReader

	sandbox.Handle
	lost      atomic.Value // string: why the pod can no longer serve
	seenReady atomic.Bool
}

var (
	_ sandbox.Sandbox         = (*k8sSandbox)(nil)
	_ sandbox.Quiescer        = (*k8sSandbox)(nil)
	_ sandbox.StdinCloser     = (*k8sSandbox)(nil)
	_ sandbox.Labeler         = (*k8sSandbox)(nil)
	_ sandbox.ImageIdentifier = (*k8sSandbox)(nil)
	_ sandbox.LimitsReporter  = (*k8sSandbox)(nil)
)

// connect execs the agent into the running pod over one stream (WebSocket,
// falling back to SPDY) and waits for its hello.
func (s *k8sSandbox) connect(ctx context.Context) error {
	k := s.k
	req := k.cs.core.RESTClient().Post().Resource("pods").Namespace(k.cfg.Namespace).Name(s.name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: ContainerName, Command: k.agentArgs(s.spec), Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := NewExecutor(k.rest, req.URL())
	if err != nil {
		return fmt.Errorf("%w: exec stream: %v", sandbox.ErrUnavailable, err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.stdin, s.streamDone = cancel, inR, make(chan struct{})
	s.ChannelOps = sandbox.NewChannelOps(sandbox.NewConn(outR, inW), s)
	go func() {
		defer close(s.streamDone)
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: s.stderr})
		if err == nil {
			err = io.EOF
		}
		if lost, _ := s.lost.Load().(string); lost != "" {
			err = errors.New(lost)
		}
		outW.CloseWithError(err)
		inR.CloseWithError(err)
	}()
	t := time.NewTimer(k.cfg.StartTimeout)
	defer t.Stop()
	select {
	case h := <-s.Conn.Hello:
		if h.Err != "" {
			s.stopStream()
			return fmt.Errorf("%w: agent start-up: %s", sandbox.ErrInvalid, h.Err)
		}
		if h.Version != agent.ProtocolVersion {
			s.stopStream()
			return fmt.Errorf("%w: agent protocol %d, want %d (stale agent image %s?)", sandbox.ErrInvalid, h.Version, agent.ProtocolVersion, k.agentI)
		}
		s.Hello = h
		return nil
	case <-s.Conn.Done():
		s.stopStream()
		return fmt.Errorf("%w: agent exited before its hello: %v %s", sandbox.ErrUnavailable, s.Conn.Broken(), s.stderr.String())
	case <-t.C:
		s.stopStream()
		return fmt.Errorf("%w: no hello from the agent within %s: %s", sandbox.ErrUnavailable, k.cfg.StartTimeout, s.stderr.String())
	case <-ctx.Done():
		s.stopStream()
		return ctx.Err()
	}
}

// newExecutor opens streams over WebSocket (the API server's current
// protocol) and falls back to SPDY for API servers that refuse the upgrade.
func NewExecutor(rc *rest.Config, u *url.URL) (remotecommand.Executor, error) {
	ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", u.String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", u)
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

func (s *k8sSandbox) stopStream() {
	if s.cancel != nil {
		s.cancel()
		if s.stdin != nil {
			s.stdin.CloseWithError(errors.New("sandbox closed"))
		}
		<-s.streamDone
		<-s.Conn.Done()
	}
}

// fail breaks the channel because the pod can no longer serve: calls in
// flight and later ones return ErrUnavailable with the reason.
func (s *k8sSandbox) fail(why string) {
	if s.lost.CompareAndSwap(nil, why) {
		s.log.Warn("sandbox pod lost", "reason", why)
		sandbox.MetricFailures.WithLabelValues("channel").Inc()
		s.cancel()
	}
}

func (s *k8sSandbox) Broken() error                 { return s.Conn.Broken() }
func (s *k8sSandbox) SetLabels(l map[string]string) { s.spec.Labels = l }

// ID is the pod name.
func (s *k8sSandbox) ID() string { return s.name }

// Node is the node the pod runs on.
func (s *k8sSandbox) Node() string { return s.node }

// ImageID is the image digest the kubelet reported for the sandbox
// container.
func (s *k8sSandbox) ImageID() string { return s.imageID }

// Applied reports the limits the pod was made with (podFor, from the
// validated spec: defaults filled in): memory and CPU limits, the disk
// bound behind its ephemeral-storage limit, the root and the network
// policy. A pod spec has no pids limit (the kubelet's podPidsLimit applies
// per node), so PIDs is 0: none enforced per pod. Runtime is the runtime
// class when one is set, else empty: the cluster's default handler.
func (s *k8sSandbox) Applied() sandbox.Applied {
	l := s.spec.Limits
	return sandbox.Applied{MemoryBytes: l.MemoryBytes, CPUs: l.CPUs, DiskBytes: l.DiskBytes, ReadOnlyRoot: l.ReadOnlyRoot,
		Network: s.spec.Network, Runtime: s.k.cfg.RuntimeClassName, Backend: sandbox.BackendKubernetes}
}

// Labels returns the caller labels of the spec.
func (s *k8sSandbox) Labels() map[string]string { return maps.Clone(s.spec.Labels) }

// broken is the Handle's hook for a broken channel: the error says what
// happened to the pod, unless fail broke it (err then carries the reason,
// and fail counted it).
func (s *k8sSandbox) broken(err error) error {
	if why, _ := s.lost.Load().(string); why != "" {
		return err
	}
	return fmt.Errorf("%w (%s)", err, s.state())
}

// state describes the pod after the channel broke.
func (s *k8sSandbox) state() string {
	if why, _ := s.lost.Load().(string); why != "" {
		return why
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pod, err := s.k.cs.core.Pods(s.k.cfg.Namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "pod was deleted"
	}
	if err != nil {
		return "pod state unknown: " + err.Error()
	}
	msg := s.podLost(pod)
	if msg == "" {
		msg = "pod " + strings.ToLower(string(pod.Status.Phase)) + " on node " + pod.Spec.NodeName
	}
	if e := s.stderr.String(); e != "" {
		msg += ", agent: " + e
	}
	return msg
}

// Close deletes the pod. It is idempotent and works with a cancelled ctx.
func (s *k8sSandbox) Close(ctx context.Context) error {
	return s.CloseOnce(func() error {
		s.stopStream()
		err := s.k.remove(ctx, s.name, s.claim)
		k := s.k
		k.mu.Lock()
		if _, ok := k.live[s.name]; ok {
			delete(k.live, s.name)
			k.cond.Broadcast()
		}
		sandbox.MetricLive.Set(float64(len(k.live)))
		k.mu.Unlock()
		return err
	})
}
