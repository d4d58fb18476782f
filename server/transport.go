package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

// DefaultMaxMsgSize bounds one gRPC message each way. Groups travel one per
// message; 8 rollouts of 32k tokens with their messages stay far below it.
const DefaultMaxMsgSize = 64 << 20

// Transport configures the gRPC server around the service.
type Transport struct {
	// Token, when set, is a bearer token calls may carry (health checks
	// excepted), compared in constant time: the tenant DefaultTenant, with
	// the server's quotas, beside the service's Options.Tenants. With
	// neither, calls need no token and every caller is one anonymous
	// tenant.
	Token string
	// TLS, when set, serves TLS.
	TLS *tls.Config
	// MaxMsgSize bounds received and sent messages (default
	// DefaultMaxMsgSize).
	MaxMsgSize int
	// RateLimit admits that many calls per second across all clients
	// (health checks excepted); 0 disables. Streams count once, when they
	// open.
	RateLimit float64
	// RateBurst is the bucket size (default max(1, RateLimit)).
	RateBurst int
}

// GRPC is the service on a gRPC server with health and reflection.
type GRPC struct {
	Server *grpc.Server
	Health *health.Server
	// drain stops the service's intake and waits for its work (Shutdown).
	drain func(ctx context.Context, cancelInFlight bool) error
	auth  *tenantAuth
}

func (g *GRPC) authenticated() bool { return g.auth != nil }

func (g *GRPC) tenantCount() int {
	if g.auth == nil {
		return 0
	}
	return len(g.auth.tenants)
}

// NewGRPC builds the gRPC server: the RolloutService, grpc.health.v1 (the
// empty service name and rollout.v1.RolloutService report SERVING) and
// server reflection, behind the metrics, auth and rate-limit interceptors.
func NewGRPC(svc *Server, t Transport) *GRPC {
	return newGRPC(t, svc.tenants(t.Token), svc.Register, rolloutv1.RolloutService_ServiceDesc.ServiceName, svc.Shutdown)
}

// NewGatewayGRPC builds the gRPC server of a standalone gateway: the
// GatewayService, health (rollout.v1.GatewayService) and reflection,
// behind the same interceptors as NewGRPC; its tenants are
// GatewayOptions.Tenants plus Transport.Token's ("default").
func NewGatewayGRPC(gs *GatewayServer, t Transport) *GRPC {
	ts := slices.Clone(gs.opts.Tenants)
	if tt := TokenTenant(t.Token); t.Token != "" && !slices.ContainsFunc(ts, func(o Tenant) bool { return o.TokenSHA256 == tt.TokenSHA256 }) {
		ts = append(ts, tt)
	}
	return newGRPC(t, ts, gs.Register, rolloutv1.GatewayService_ServiceDesc.ServiceName,
		func(ctx context.Context, _ bool) error { return gs.Shutdown(ctx) })
}

func newGRPC(t Transport, tenants []Tenant, register func(*grpc.Server), service string, drain func(context.Context, bool) error) *GRPC {
	if t.MaxMsgSize <= 0 {
		t.MaxMsgSize = DefaultMaxMsgSize
	}
	g := &guard{}
	if len(tenants) > 0 {
		g.auth = newTenantAuth(tenants)
	}
	if t.RateLimit > 0 {
		burst := t.RateBurst
		if burst <= 0 {
			burst = max(1, int(t.RateLimit))
		}
		g.limit = rate.NewLimiter(rate.Limit(t.RateLimit), burst)
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(t.MaxMsgSize),
		grpc.MaxSendMsgSize(t.MaxMsgSize),
		grpc.ChainUnaryInterceptor(rpcUnaryMetrics, g.unary),
		grpc.ChainStreamInterceptor(rpcStreamMetrics, g.stream),
		// Watch and collect streams idle for long stretches: let clients
		// keep them alive through NATs without being disconnected.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if t.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(t.TLS)))
	}
	gs := grpc.NewServer(opts...)
	register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(service, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(gs)
	return &GRPC{Server: gs, Health: hs, drain: drain, auth: g.auth}
}

// Shutdown stops the server gracefully: health turns NOT_SERVING, the
// service stops intake and drains its jobs and streams (or cancels their
// in-flight rollouts), then the gRPC server stops once its calls have
// ended. When ctx ends first, in-flight rollouts are cancelled and the
// remaining calls are cut.
func (g *GRPC) Shutdown(ctx context.Context, cancelInFlight bool) error {
	g.Health.Shutdown()
	err := g.drain(ctx, cancelInFlight)
	stopped := make(chan struct{})
	go func() {
		g.Server.GracefulStop()
		close(stopped)
	}()
	// Streams end once their jobs have; give stragglers a moment before
	// cutting them.
	grace := time.NewTimer(5 * time.Second)
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		g.Server.Stop()
		<-stopped
	}
	return err
}

// Listen opens addr: "host:port", or "unix:PATH" / "unix:///PATH" for a
// unix socket (a stale socket is replaced; any other file is an error).
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		p = strings.TrimPrefix(p, "//")
		// Replace a socket left by a previous server, nothing else.
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if err := os.Remove(p); err != nil {
				return nil, fmt.Errorf("listen on %s: %w", addr, err)
			}
		}
		ln, err := lc.Listen(ctx, "unix", p)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return ln, nil
	}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// RunOptions configure Run.
type RunOptions struct {
	Transport
	// Listener for gRPC (see Listen).
	Listener net.Listener
	// MetricsListener, when set, serves GET /metrics over HTTP.
	MetricsListener net.Listener
	// DrainTimeout bounds the graceful drain at shutdown; in-flight
	// rollouts still running then are cancelled (0: wait as long as it
	// takes).
	DrainTimeout time.Duration
	// CancelInFlight cancels in-flight rollouts at shutdown instead of
	// letting them finish.
	CancelInFlight bool
	// Force, when closed during the drain, cancels in-flight rollouts (a
	// second interrupt).
	Force <-chan struct{}
	// Ready, when set, is called once the server accepts calls.
	Ready  func()
	Logger *slog.Logger
}

// Run serves svc until ctx ends, then shuts down gracefully (see
// GRPC.Shutdown); interrupted jobs stay RUNNING in the state dir and resume
// on the next start. Run closes the listeners.
func Run(ctx context.Context, svc *Server, o RunOptions) error {
	return runGRPC(ctx, NewGRPC(svc, o.Transport), svc.Collector(), "rollout service", o)
}

// GatewayRunOptions configure RunGateway.
type GatewayRunOptions struct {
	RunOptions
	// HTTPListener serves the gateway's front doors (capture.Handler).
	HTTPListener net.Listener
	// HTTPTLS, when set, serves the front doors over HTTPS (HTTP/2
	// offered); nil serves cleartext HTTP.
	HTTPTLS *tls.Config
}

// RunGateway serves a standalone gateway until ctx ends: its session
// control over gRPC (the GatewayService, with the transport, auth and
// metrics of Run) and its front doors over HTTP. At the end it shuts down
// gracefully: OpenSession is refused, open sessions are closed (calls in
// flight answered first) and recorded, groups are written and the run
// directory flushed (GatewayServer.Shutdown), then the HTTP server stops.
// RunGateway closes the listeners.
func RunGateway(ctx context.Context, gs *GatewayServer, o GatewayRunOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	srv := &http.Server{Handler: capture.Handler(gs.Gateway(), builtin.FrontDoors()), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	httpDone := make(chan error, 1)
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	scheme := "http"
	if o.HTTPTLS != nil {
		scheme, srv.TLSConfig = "https", o.HTTPTLS.Clone()
	}
	go func() {
		var err error
		if srv.TLSConfig != nil {
			err = srv.ServeTLS(o.HTTPListener, "", "") // the certificates are in TLSConfig
		} else {
			err = srv.Serve(o.HTTPListener)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("gateway front doors failed, shutting down", "error", err)
			stop()
		}
		httpDone <- err
	}()
	log.Info("gateway front doors listening", "addr", scheme+"://"+o.HTTPListener.Addr().String(), "dir", gs.Dir())
	err := runGRPC(hctx, NewGatewayGRPC(gs, o.Transport), nil, "rollout gateway", o.RunOptions)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if herr := <-httpDone; !errors.Is(herr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("http: %w", herr))
	}
	return err
}

func runGRPC(ctx context.Context, g *GRPC, reg prometheus.Collector, name string, o RunOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	grpcDone := make(chan error, 1)
	go func() { grpcDone <- g.Server.Serve(o.Listener) }()

	var metricsSrv *http.Server
	var metricsDone chan error // nil without metrics: never ready
	if o.MetricsListener != nil {
		if reg != nil {
			if err := prometheus.Register(reg); err != nil {
				log.Warn("register job metrics", "error", err)
			} else {
				defer prometheus.Unregister(reg)
			}
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", MetricsHandler())
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		metricsDone = make(chan error, 1)
		go func() { metricsDone <- metricsSrv.Serve(o.MetricsListener) }()
		log.Info("metrics listening", "addr", "http://"+o.MetricsListener.Addr().String()+"/metrics")
	}
	log.Info(name+" listening", "addr", o.Listener.Addr().String(), "tls", o.TLS != nil, "auth", g.authenticated(), "tenants", g.tenantCount())
	if o.Ready != nil {
		o.Ready()
	}

	var runErr error
	grpcEnded, metricsEnded := false, false
	select {
	case <-ctx.Done():
	case err := <-grpcDone:
		grpcEnded, runErr = true, fmt.Errorf("grpc: %w", err)
	case err := <-metricsDone:
		metricsEnded = true
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("metrics: %w", err)
		}
	}
	if runErr != nil {
		log.Error("server failed, shutting down", "error", runErr)
	}
	log.Info("shutting down: intake stopped, draining", "service", name, "cancel_in_flight", o.CancelInFlight, "drain_timeout", o.DrainTimeout.String())
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if o.DrainTimeout > 0 {
		var c2 context.CancelFunc
		dctx, c2 = context.WithTimeout(dctx, o.DrainTimeout)
		defer c2()
	}
	stopForce := make(chan struct{})
	forced := make(chan struct{})
	go func() {
		defer close(forced)
		select {
		case <-o.Force:
			log.Warn("second interrupt: cancelling in-flight rollouts")
			cancel()
		case <-stopForce:
		}
	}()
	err := g.Shutdown(dctx, o.CancelInFlight)
	close(stopForce)
	<-forced
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		log.Warn("drain cut short: in-flight rollouts were cancelled", "error", err)
		err = nil
	}
	if !grpcEnded {
		<-grpcDone // Serve returns once GracefulStop/Stop closed the listener
	}
	if metricsSrv != nil {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = metricsSrv.Shutdown(sctx)
		scancel()
	}
	if metricsSrv != nil && !metricsEnded {
		<-metricsDone
	}
	log.Info(name + " stopped")
	return errors.Join(runErr, err)
}
