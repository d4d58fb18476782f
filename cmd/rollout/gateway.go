package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/server"
)

func init() { register(newGatewayCmd) }

type gatewayFlags struct {
	config        string
	out           string
	groupSize     int
	listen        string
	httpListen    string
	publicURL     string
	metricsListen string
	idleTimeout   time.Duration
	maxSessions   int
	tokenFile     string
	tenantsFile   string
	tlsClientCA   string
	tlsCert       string
	tlsKey        string
	httpTLSCert   string
	httpTLSKey    string
	drainTimeout  time.Duration
}

func newGatewayCmd() *cobra.Command {
	f := &gatewayFlags{}
	cmd := &cobra.Command{
		Use:   "gateway -c CONFIG.yaml",
		Short: "Serve a standalone token-capturing gateway for harnesses that run elsewhere (docs/gateway.md)",
		Long: `Serve the token-capturing gateway on its own: the OpenAI Chat Completions,
OpenAI Responses and Anthropic Messages front doors (plus /v1/models and the
probes) over HTTP on --http-listen, one base URL per session, and the
session control API (rollout.v1.GatewayService) over gRPC on --listen.

A caller opens a session per rollout (OpenSession), points its harness at
the returned base URL, closes the session when the harness is done
(CloseSession: the session's branches, calls and token counts) and posts
its reward (ScoreSession). When every session of a group is scored, the
group gets its advantages (advantage.mode), is written to output.dir as
Parquet rows (as harness envs' rows) and is streamed to
WatchSessionGroups. The run config's inference, parser, reasoning_parser,
sampling, group_size, advantage and output keys apply; env and sandbox do
not.

A session idle for --idle-timeout is closed and recorded without a reward
(failure kind session_expired). On SIGINT/SIGTERM the gateway refuses new
sessions, closes the open ones (recorded the same way), writes every group
and flushes the run directory.

With --tenants-file (and --auth-token-file, whose token is the tenant
"default") each tenant's sessions and groups are its own: another tenant
can neither close, score nor watch them.`,
		Example: `  rollout gateway -c gateway.yaml
  rollout gateway -c gateway.yaml --http-listen 0.0.0.0:8090 --public-url http://10.0.0.5:8090 \
      --listen 0.0.0.0:50052 --auth-token-file /etc/rollout/token --tls-cert s.crt --tls-key s.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runGateway(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", "", "run config YAML (required; see docs/config.md)")
	fl.StringVar(&f.out, "out", "", "output run directory (overrides output.dir)")
	fl.IntVar(&f.groupSize, "group-size", 0, "sessions per group when OpenSession does not say (overrides group_size; default 1)")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:50052", "gRPC address of the session control API: host:port, or unix:PATH")
	fl.StringVar(&f.httpListen, "http-listen", "127.0.0.1:8090", "HTTP address of the front doors harnesses call")
	fl.StringVar(&f.publicURL, "public-url", "", "base URL harnesses reach --http-listen at (default http(s)://<--http-listen's address>)")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "HTTP address for GET /metrics (empty: no metrics port)")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", server.DefaultIdleTimeout, "close a session with no call for this long and record it without a reward (0: never)")
	fl.IntVar(&f.maxSessions, "max-sessions", 0, "open sessions at once (default 10000); over it OpenSession is RESOURCE_EXHAUSTED")
	fl.StringVar(&f.tokenFile, "auth-token-file", "", "file holding the bearer token gRPC callers must send (off loopback this or --tenants-file is required)")
	fl.StringVar(&f.tenantsFile, "tenants-file", "", "YAML file of tenants (as rollout serve's: a name and a bearer token each); sessions and groups belong to the tenant that opened them, watchers get their tenant's groups only; with --auth-token-file, that token is one more tenant, \"default\"")
	fl.StringVar(&f.tlsClientCA, "tls-client-ca", "", "verify client certificates signed by this CA (PEM) when clients present one: tenants are then known by their certificate's names too (client_names in --tenants-file); needs --tls-cert")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "TLS certificate (PEM) of the gRPC API; with --tls-key")
	fl.StringVar(&f.tlsKey, "tls-key", "", "TLS private key (PEM); with --tls-cert")
	fl.StringVar(&f.httpTLSCert, "http-tls-cert", "", "TLS certificate (PEM) of the front doors (HTTPS); with --http-tls-key")
	fl.StringVar(&f.httpTLSKey, "http-tls-key", "", "TLS private key (PEM) of the front doors; with --http-tls-cert")
	fl.DurationVar(&f.drainTimeout, "drain-timeout", time.Minute, "at shutdown, cut calls still in flight after this long (0: wait)")
	return cmd
}

func runGateway(cmd *cobra.Command, f *gatewayFlags) error {
	switch {
	case f.config == "":
		return usageError(cmd, errors.New("--config is required"))
	case (f.tlsCert == "") != (f.tlsKey == ""):
		return usageError(cmd, errors.New("--tls-cert and --tls-key go together"))
	case f.tlsClientCA != "" && f.tlsCert == "":
		return usageError(cmd, errors.New("--tls-client-ca needs --tls-cert and --tls-key"))
	case (f.httpTLSCert == "") != (f.httpTLSKey == ""):
		return usageError(cmd, errors.New("--http-tls-cert and --http-tls-key go together"))
	case f.idleTimeout < 0 || f.maxSessions < 0 || f.drainTimeout < 0 || f.groupSize < 0:
		return usageError(cmd, errors.New("--idle-timeout, --max-sessions, --drain-timeout and --group-size must not be negative"))
	}
	cfg, err := runner.LoadConfig(f.config)
	if err != nil {
		return withExitCode(2, err)
	}
	if f.out != "" {
		cfg.Output.Dir = f.out
	}
	if f.groupSize > 0 {
		cfg.GroupSize = f.groupSize
	}
	var t server.Transport
	if f.tokenFile != "" {
		if t.Token, err = server.ReadTokenFile(f.tokenFile); err != nil {
			return withExitCode(2, err)
		}
	}
	var tenants []server.Tenant
	if f.tenantsFile != "" {
		if tenants, err = server.LoadTenants(f.tenantsFile); err != nil {
			return withExitCode(2, err)
		}
	}
	if err := server.CheckListen(f.listen, t.Token != "" || len(tenants) > 0); err != nil {
		return withExitCode(2, err)
	}
	if f.tlsCert != "" {
		if t.TLS, err = server.LoadTLS(f.tlsCert, f.tlsKey); err != nil {
			return withExitCode(2, err)
		}
		if f.tlsClientCA != "" {
			if err := server.LoadClientCA(t.TLS, f.tlsClientCA); err != nil {
				return withExitCode(2, err)
			}
		}
	}
	var httpTLS *tls.Config
	if f.httpTLSCert != "" {
		if httpTLS, err = server.LoadTLS(f.httpTLSCert, f.httpTLSKey); err != nil {
			return withExitCode(2, err)
		}
	}
	log := newLogger(os.Stderr)
	ctx := cmd.Context()
	hl, err := server.Listen(ctx, f.httpListen)
	if err != nil {
		return err
	}
	public := f.publicURL
	if public == "" {
		public = "http://" + hl.Addr().String()
		if httpTLS != nil {
			public = "https://" + hl.Addr().String()
		}
	}
	idle := f.idleTimeout
	if idle == 0 {
		idle = -1 // GatewayOptions: negative = never
	}
	gs, err := server.NewGatewayServer(ctx, cfg, server.GatewayOptions{Logger: log, BaseURL: public, IdleTimeout: idle, MaxSessions: f.maxSessions, Tenants: tenants})
	if err != nil {
		hl.Close()
		return withExitCode(2, err)
	}
	o := server.GatewayRunOptions{HTTPListener: hl, HTTPTLS: httpTLS, RunOptions: server.RunOptions{Transport: t, DrainTimeout: f.drainTimeout, Logger: log}}
	closeAll := func() {
		hl.Close()
		if o.Listener != nil {
			o.Listener.Close()
		}
		_ = gs.Shutdown(ctx)
	}
	if o.Listener, err = server.Listen(ctx, f.listen); err != nil {
		closeAll()
		return err
	}
	if f.metricsListen != "" {
		if o.MetricsListener, err = server.Listen(ctx, f.metricsListen); err != nil {
			closeAll()
			return err
		}
	}
	if err := server.RunGateway(ctx, gs, o); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}
