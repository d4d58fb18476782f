package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/rollout-rl/rollout/sandbox/host"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/atropos"
	"github.com/rollout-rl/rollout/internal/util/netpolicy"
	"github.com/rollout-rl/rollout/internal/util/secrets"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/server"
)

func init() { register(newServeCmd) }

type serveFlags struct {
	listen         string
	metricsListen  string
	stateDir       string
	dataDir        string
	allowPaths     []string
	allowEnv       []string
	allowNet       []string
	tokenFile      string
	tenantsFile    string
	tenants        []server.Tenant
	tlsCert        string
	tlsKey         string
	tlsClientCA    string
	cancelInFlight bool
	drainTimeout   time.Duration
	cancelGrace    time.Duration
	maxMsgSize     int
	rateLimit      float64
	rateBurst      int
	maxSandboxes   int
	warmSandboxes  int
	atroposURL     string
	quotas         server.Quotas
	tracing        tracingFlags
}

func newServeCmd() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the gRPC API: jobs, trainer-driven collection, the env catalogue (docs/api.md)",
		Long: `Serve the rollout gRPC API (rollout.v1.RolloutService, grpc.health.v1 and
server reflection) on --listen, and Prometheus metrics on --metrics-listen.

Jobs write to run directories under --data-dir and are recorded in
--state-dir: after a restart, jobs that were running resume where their run
directory left off. On SIGINT/SIGTERM the server stops intake, lets
in-flight rollouts finish (up to --drain-timeout; --cancel-in-flight or a
second signal cancels them), flushes outputs, removes its sandboxes and
exits.

Off loopback the server requires --auth-token-file or --tenants-file
(clients send "authorization: Bearer <token>"); use --tls-cert/--tls-key
there too. Each tenant (each token) has its own quotas and sees only its
own jobs and streams.`,
		Example: `  rollout serve
  rollout serve --listen 0.0.0.0:50051 --auth-token-file /etc/rollout/token \
      --tls-cert server.crt --tls-key server.key --metrics-listen 127.0.0.1:9464
  rollout serve --listen unix:///run/rollout.sock --data-dir /srv/rollout`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:50051", "gRPC address: host:port, or unix:PATH")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "HTTP address for GET /metrics (empty: no metrics port)")
	fl.StringVar(&f.dataDir, "data-dir", ".", "where relative paths of job configs resolve (output.dir, dataset.path, env files)")
	fl.StringVar(&f.stateDir, "state-dir", "", "where job states are kept so jobs resume after a restart (default <data-dir>/.rollout-server; \"none\" disables)")
	fl.StringSliceVar(&f.allowPaths, "allow-path", nil, "absolute path prefix job configs may use besides --data-dir (repeatable)")
	fl.StringSliceVar(&f.allowEnv, "allow-env", nil, "environment variable job configs may name for a secret (api_key_env, bearer_token_env): a name, or a prefix ending in * (repeatable; default: none)")
	fl.StringSliceVar(&f.allowNet, "allow-net", nil, "non-public address (IP, CIDR prefix), host name or *.domain a job may connect to: its inference endpoints, teacher, judges, MCP servers, web providers (repeatable; \"none\": confine with no exception). Off loopback jobs reach public addresses only, loopback/private/link-local refused unless allowed here; on loopback they are confined only when this is given (docs/security.md, \"Outbound connections\")")
	fl.StringVar(&f.tokenFile, "auth-token-file", "", "file holding the bearer token clients must send (required off loopback)")
	fl.StringVar(&f.tenantsFile, "tenants-file", "", "YAML file of tenants: each a name, a bearer token (token_sha256 or token_file) and its own quotas; jobs belong to the tenant that started them (docs/api.md, \"Tenants\"); with --auth-token-file, that token is one more tenant, \"default\"")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "TLS certificate (PEM); with --tls-key")
	fl.StringVar(&f.tlsKey, "tls-key", "", "TLS private key (PEM); with --tls-cert")
	fl.StringVar(&f.tlsClientCA, "tls-client-ca", "", "verify client certificates signed by this CA (PEM) when clients present one: tenants are then known by their certificate's names too (client_names in --tenants-file); needs --tls-cert")
	fl.BoolVar(&f.cancelInFlight, "cancel-in-flight", false, "at shutdown, cancel running rollouts instead of letting them finish")
	fl.DurationVar(&f.drainTimeout, "drain-timeout", 10*time.Minute, "at shutdown, cancel rollouts still running after this long (0: wait)")
	fl.DurationVar(&f.cancelGrace, "cancel-grace", server.DefaultCancelGrace, "after `job cancel` without --in-flight, cancel the job's rollouts still running after this long (0: wait for them)")
	fl.IntVar(&f.maxMsgSize, "max-msg-size", server.DefaultMaxMsgSize, "largest gRPC message received or sent, in bytes")
	fl.Float64Var(&f.rateLimit, "rate-limit", 0, "calls per second admitted across all clients, streams counted when opened (0: unlimited)")
	fl.IntVar(&f.rateBurst, "rate-burst", 0, "burst size of --rate-limit (default: the rate, at least 1)")
	fl.IntVar(&f.maxSandboxes, "max-sandboxes", 0, "sandbox containers alive at once across all jobs (default 512); also the most pods of each Kubernetes backend (sandbox.kubernetes.max_pods)")
	fl.IntVar(&f.warmSandboxes, "warm-sandboxes", 64, "idle sandboxes kept by each shared backend (Docker; each Kubernetes one) across all jobs: started ahead of a job's groups, or reset in place for its next rollouts with sandbox.reuse (they count against --max-sandboxes and give way to any job needing a slot; 0: none, every sandbox created on demand)")
	fl.IntVar(&f.quotas.Jobs, "quota-jobs", 0, "jobs and collect streams one tenant (token) may run at once (default 8; -1: no quota; a tenant's quotas.jobs overrides it)")
	fl.IntVar(&f.quotas.Sandboxes, "quota-sandboxes", 0, "sum of limits.sandboxes over one tenant's running jobs and streams (default 256; -1: no quota; a tenant's quotas.sandboxes overrides it)")
	fl.Int64Var(&f.quotas.Rows, "quota-rows", 0, "rollouts (groups x group_size) one job or CollectGroups stream may produce (default 1000000; -1: no quota; a tenant's quotas.rows overrides it)")
	fl.StringVar(&f.atroposURL, "atropos-url", "", "feed the groups of run jobs to this Atropos API (run-api), one Atropos env per job; a job's atropos.url overrides it, atropos.disabled opts out (docs/atropos.md)")
	f.tracing.add(fl)
	return cmd
}

func serve(cmd *cobra.Command, f *serveFlags) error {
	if err := f.check(cmd); err != nil {
		return err
	}
	cancelGrace := f.cancelGrace
	if cancelGrace == 0 {
		cancelGrace = -1 // server.Options: negative = no bound
	}
	t, err := f.transport()
	if err != nil {
		return withExitCode(2, err)
	}
	// Job configs come from clients: the variables they may name for a
	// secret are the operator's choice, none by default.
	defer secrets.Restrict(f.allowEnv)()

	log := newLogger(os.Stderr)
	// Deferred first, so it flushes last: after the drain and sandbox removal.
	stopTracing, err := f.tracing.start(cmd.Context(), log)
	if err != nil {
		return withExitCode(2, err)
	}
	defer stopTracing()
	if !server.IsLocalAddr(f.listen) && t.TLS == nil {
		log.Warn("listening off loopback without TLS: bearer tokens and trajectories travel in clear text (use --tls-cert/--tls-key)")
	}
	if f.metricsListen != "" && !server.IsLocalAddr(f.metricsListen) {
		log.Warn("the metrics port is unauthenticated and listens off loopback", "addr", f.metricsListen)
	}
	stateDir := f.stateDir
	switch stateDir {
	case "":
		stateDir = filepath.Join(f.dataDir, ".rollout-server")
	case "none":
		stateDir = ""
	}

	ctx := cmd.Context()
	ln, err := server.Listen(ctx, f.listen)
	if err != nil {
		return err
	}
	o := server.RunOptions{Transport: t, Listener: ln, DrainTimeout: f.drainTimeout, CancelInFlight: f.cancelInFlight, Logger: log}
	if f.metricsListen != "" {
		m, err := server.Listen(ctx, f.metricsListen)
		if err != nil {
			ln.Close()
			return err
		}
		o.MetricsListener = m
	}

	// One Docker backend and warm pool for every job, and one Kubernetes
	// backend per distinct sandbox.kubernetes block of jobs with
	// sandbox.backend kubernetes (docs/kubernetes.md), each started on its
	// first sandbox; they are closed last, removing whatever sandboxes
	// remain.
	shared := assemble.NewShared(docker.Options{Options: host.Options{Logger: log, MaxContainers: f.maxSandboxes}}, f.warmSandboxes)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := shared.Close(cctx); err != nil {
			log.Warn("remove sandboxes", "error", err)
		}
	}()
	netPolicy, err := f.netPolicy()
	if err != nil {
		ln.Close()
		if o.MetricsListener != nil {
			o.MetricsListener.Close()
		}
		return usageError(cmd, err)
	}
	if netPolicy == nil {
		log.Info("jobs' outbound connections are not confined: the server listens on loopback (confine them with --allow-net)")
	}
	svc, err := server.New(ctx, server.Options{NetPolicy: netPolicy, StateDir: stateDir, DataDir: f.dataDir, AllowedPaths: f.allowPaths,
		Sandboxes: shared, Images: shared, Logger: log, JobSinks: atroposJobSinks(f.atroposURL), Quotas: f.quotas, CancelGrace: cancelGrace,
		Tenants: f.tenants})
	if err != nil {
		ln.Close()
		if o.MetricsListener != nil {
			o.MetricsListener.Close()
		}
		return err
	}

	force, served, stopWatch := watchSecondSignal(ctx)
	defer stopWatch()
	o.Force = force
	err = server.Run(ctx, svc, o)
	served()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// check refuses flag values serve cannot start with.
func (f *serveFlags) check(cmd *cobra.Command) error {
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return usageError(cmd, errors.New("--tls-cert and --tls-key go together"))
	}
	if f.tlsClientCA != "" && f.tlsCert == "" {
		return usageError(cmd, errors.New("--tls-client-ca needs --tls-cert and --tls-key"))
	}
	if f.maxMsgSize <= 0 || f.rateLimit < 0 || f.rateBurst < 0 || f.maxSandboxes < 0 || f.warmSandboxes < 0 || f.drainTimeout < 0 {
		return usageError(cmd, errors.New("--max-msg-size must be positive; --rate-limit, --rate-burst, --max-sandboxes, --warm-sandboxes and --drain-timeout must not be negative"))
	}
	if f.cancelGrace < 0 {
		return usageError(cmd, errors.New("--cancel-grace must not be negative (0: wait for in-flight rollouts)"))
	}
	if f.atroposURL != "" {
		if err := atropos.CheckURL(f.atroposURL); err != nil {
			return usageError(cmd, fmt.Errorf("--atropos-url: %w", err))
		}
	}
	return nil
}

// netPolicy is the network policy of jobs' outbound connections: public
// addresses plus --allow-net. A server listening off loopback always has
// one; on loopback (only this machine's users reach it, and they reach
// the network themselves) only when --allow-net is given ("none": confine,
// allow no non-public address).
func (f *serveFlags) netPolicy() (*netpolicy.Policy, error) {
	entries := f.allowNet
	if len(entries) == 1 && entries[0] == "none" {
		entries = nil
	} else if len(entries) == 0 && server.IsLocalAddr(f.listen) {
		return nil, nil
	}
	return netpolicy.New(entries, "rollout serve --allow-net")
}

// transport is the gRPC transport the flags ask for: bearer token, TLS,
// message size and rate limits, on a listen address that allows them.
func (f *serveFlags) transport() (server.Transport, error) {
	var t server.Transport
	if f.tokenFile != "" {
		tok, err := server.ReadTokenFile(f.tokenFile)
		if err != nil {
			return t, err
		}
		t.Token = tok
	}
	if f.tenantsFile != "" {
		ts, err := server.LoadTenants(f.tenantsFile)
		if err != nil {
			return t, err
		}
		f.tenants = ts
	}
	if err := server.CheckListen(f.listen, t.Token != "" || len(f.tenants) > 0); err != nil {
		return t, err
	}
	if f.tlsCert != "" {
		cfg, err := server.LoadTLS(f.tlsCert, f.tlsKey)
		if err != nil {
			return t, err
		}
		if f.tlsClientCA != "" {
			if err := server.LoadClientCA(cfg, f.tlsClientCA); err != nil {
				return t, err
			}
		}
		t.TLS = cfg
	}
	t.MaxMsgSize, t.RateLimit, t.RateBurst = f.maxMsgSize, f.rateLimit, f.rateBurst
	return t, nil
}

// watchSecondSignal gives the channel closed by a second SIGINT/SIGTERM (the
// first ends ctx, through the root command), which cancels the rollouts
// still in flight during the drain. served tells the watcher the server is
// done; stop waits for it to end.
func watchSecondSignal(ctx context.Context) (force chan struct{}, served func(), stop func()) {
	force = make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		select {
		case <-sigs: // may be the first signal, still queued
		case <-done:
			return
		}
		select {
		case <-sigs:
			close(force)
		case <-done:
		}
	}()
	var once sync.Once
	served = func() { once.Do(func() { close(done) }) }
	stop = func() {
		served()
		<-watched
		signal.Stop(sigs)
	}
	return force, served, stop
}

// atroposJobSinks gives each run job whose config or --atropos-url names an
// Atropos API its own bridge (spool in the job's run directory, so a
// resumed job replays it); the server ends it when the job ends.
func atroposJobSinks(defaultURL string) func(context.Context, server.JobSpec) (server.ExtraSinks, error) {
	return func(ctx context.Context, spec server.JobSpec) (server.ExtraSinks, error) {
		b, err := atropos.OpenRun(ctx, spec.Config, atropos.RunSetup{Mode: spec.Mode, DefaultURL: defaultURL, Logger: spec.Logger})
		if err != nil || b == nil {
			return server.ExtraSinks{}, err
		}
		return server.ExtraSinks{Sinks: []runner.Sink{b}, End: b.Finish}, nil
	}
}
