package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/server"
)

func init() { register(newJobCmd) }

// clientFlags say how `rollout job ...` reaches the server.
type clientFlags struct {
	addr       string
	tokenFile  string
	tls        bool
	caFile     string
	serverName string
	skipVerify bool
	certFile   string
	keyFile    string
	timeout    time.Duration
}

func (c *clientFlags) add(cmd *cobra.Command) {
	fl := cmd.PersistentFlags()
	fl.StringVar(&c.addr, "addr", envOr("ROLLOUT_ADDR", "127.0.0.1:50051"), "server address: host:port or unix:PATH ($ROLLOUT_ADDR)")
	fl.StringVar(&c.tokenFile, "auth-token-file", os.Getenv("ROLLOUT_AUTH_TOKEN_FILE"), "file holding the bearer token ($ROLLOUT_AUTH_TOKEN_FILE)")
	fl.BoolVar(&c.tls, "tls", false, "connect with TLS, verifying the server against the system roots")
	fl.StringVar(&c.caFile, "tls-ca", "", "connect with TLS, verifying the server against this CA certificate (PEM)")
	fl.StringVar(&c.serverName, "tls-server-name", "", "name to verify in the server's certificate (default: from --addr)")
	fl.BoolVar(&c.skipVerify, "insecure-skip-verify", false, "connect with TLS without verifying the server (testing only)")
	fl.StringVar(&c.certFile, "tls-client-cert", "", "client certificate (PEM) to present: a tenant known by its certificate (docs/api.md, \"Tenants\"); with --tls-client-key")
	fl.StringVar(&c.keyFile, "tls-client-key", "", "the client certificate's private key (PEM)")
	fl.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline of each non-streaming call")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (c *clientFlags) dial() (*server.Client, error) {
	if (c.certFile == "") != (c.keyFile == "") {
		return nil, errors.New("--tls-client-cert and --tls-client-key go together")
	}
	o := server.ClientOptions{Addr: c.addr, TLS: c.tls, CAFile: c.caFile, ServerName: c.serverName, InsecureSkipVerify: c.skipVerify,
		CertFile: c.certFile, KeyFile: c.keyFile}
	if c.tokenFile != "" {
		tok, err := server.ReadTokenFile(c.tokenFile)
		if err != nil {
			return nil, withExitCode(2, err)
		}
		o.Token = tok
	}
	return server.Dial(o)
}

// call runs one non-streaming call with the --timeout deadline.
func (c *clientFlags) call(ctx context.Context, fn func(ctx context.Context, cli *server.Client) error) error {
	cli, err := c.dial()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return rpcError(c.addr, fn(ctx, cli))
}

// rpcError turns a gRPC status into a CLI error: invalid input exits 2.
func rpcError(addr string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.InvalidArgument:
		return withExitCode(2, errors.New(st.Message()))
	case codes.Unavailable:
		return fmt.Errorf("server %s unavailable: %s", addr, st.Message())
	case codes.Unauthenticated:
		return fmt.Errorf("not authenticated (--auth-token-file): %s", st.Message())
	}
	return fmt.Errorf("%s: %s", codeWords(st.Code()), st.Message())
}

// codeWords spells a code for people: NotFound -> "not found".
func codeWords(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte(' ')
		}
		b.WriteRune(r)
	}
	return strings.ToLower(b.String())
}

func newJobCmd() *cobra.Command {
	c := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Start, inspect, cancel and watch jobs on a running `rollout serve`",
		Long: `Talk to a running rollout server (rollout serve) over gRPC. Paths inside a
job config (output.dir, dataset.path, env files) are paths on the server,
relative to its --data-dir. See docs/api.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	c.add(cmd)
	cmd.AddCommand(newJobStartCmd(c), newJobGetCmd(c), newJobListCmd(c), newJobCancelCmd(c), newJobWatchCmd(c))
	return cmd
}

func newJobStartCmd(c *clientFlags) *cobra.Command {
	var (
		config, id, out string
		groups          int
		eval, remote    bool
		watch           watchFlags
		doWatch         bool
	)
	cmd := &cobra.Command{
		Use:   "start -c CONFIG.yaml",
		Short: "Start a job from a run config and print its id",
		Example: `  rollout job start -c run.yaml
  rollout job start -c run.yaml --id nightly-1 --out runs/nightly-1 --watch
  rollout job start -c configs/eval.yaml --remote --eval`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if config == "" {
				return usageError(cmd, errors.New("--config is required"))
			}
			req := &rolloutv1.StartJobRequest{JobId: id, Mode: rolloutv1.JobMode_JOB_MODE_RUN}
			if eval {
				req.Mode = rolloutv1.JobMode_JOB_MODE_EVAL
			}
			if remote {
				if out != "" || cmd.Flags().Changed("groups") {
					return usageError(cmd, errors.New("--out and --groups cannot change a --remote config"))
				}
				req.Config = &rolloutv1.StartJobRequest_ConfigPath{ConfigPath: config}
			} else {
				text, err := os.ReadFile(config)
				if err != nil {
					return withExitCode(2, fmt.Errorf("run config: %w", err))
				}
				var sets []yamlSet
				if out != "" {
					sets = append(sets, yamlSet{[]string{"output", "dir"}, out, "!!str"})
				}
				if cmd.Flags().Changed("groups") {
					sets = append(sets, yamlSet{[]string{"groups"}, strconv.Itoa(groups), "!!int"})
				}
				if len(sets) > 0 {
					if text, err = setYAML(text, sets); err != nil {
						return withExitCode(2, fmt.Errorf("%s: %w", config, err))
					}
				}
				req.Config = &rolloutv1.StartJobRequest_ConfigYaml{ConfigYaml: string(text)}
			}
			var j *rolloutv1.Job
			err := c.call(cmd.Context(), func(ctx context.Context, cli *server.Client) error {
				resp, err := cli.StartJob(ctx, req)
				if err == nil {
					j = resp.Job
				}
				return err
			})
			if err != nil {
				return err
			}
			if !doWatch {
				fmt.Fprintln(cmd.OutOrStdout(), j.Id)
				return nil
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "job %s started (output %s)\n", j.Id, j.OutputDir)
			return watchJob(cmd, c, j.Id, watch)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&config, "config", "c", "", "run config YAML (docs/config.md), sent to the server (required)")
	fl.BoolVar(&remote, "remote", false, "--config names a file on the server (relative to its --data-dir) instead of a local one")
	fl.StringVar(&id, "id", "", "job id (default: generated); starting an existing id returns that job")
	fl.StringVar(&out, "out", "", "output run directory on the server (overrides output.dir)")
	fl.IntVar(&groups, "groups", 0, "number of items/groups (overrides groups; 0 = all)")
	fl.BoolVar(&eval, "eval", false, "evaluation job (eval split, report in <output>/eval)")
	fl.BoolVar(&doWatch, "watch", false, "watch the job until it ends (like `rollout job watch`)")
	watch.add(cmd)
	return cmd
}

func newJobGetCmd(c *clientFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get JOB_ID",
		Short: "Show one job",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.call(cmd.Context(), func(ctx context.Context, cli *server.Client) error {
				resp, err := cli.GetJob(ctx, &rolloutv1.GetJobRequest{JobId: args[0]})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp.Job, true)
				}
				printJob(cmd.OutOrStdout(), resp.Job)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the job as JSON")
	return cmd
}

func newJobListCmd(c *clientFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the server's jobs, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.call(cmd.Context(), func(ctx context.Context, cli *server.Client) error {
				resp, err := cli.ListJobs(ctx, &rolloutv1.ListJobsRequest{})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), resp, true)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSTATE\tMODE\tENV\tGROUPS\tMEAN REWARD\tCREATED")
				for _, j := range resp.Jobs {
					p := j.GetProgress()
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.3f\t%s\n", j.Id, stateName(j.State), modeName(j.Mode), j.Env,
						groupsDone(p), p.GetMeanReward(), j.CreatedAt.AsTime().Local().Format(time.DateTime))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the jobs as JSON")
	return cmd
}

func newJobCancelCmd(c *clientFlags) *cobra.Command {
	var inFlight bool
	cmd := &cobra.Command{
		Use:   "cancel JOB_ID",
		Short: "Stop a job's intake; running rollouts finish (within the server's --cancel-grace) unless --in-flight",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.call(cmd.Context(), func(ctx context.Context, cli *server.Client) error {
				resp, err := cli.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: args[0], CancelInFlight: inFlight})
				if err != nil {
					return err
				}
				j := resp.Job
				if j.State == rolloutv1.JobState_JOB_STATE_RUNNING {
					fmt.Fprintf(cmd.OutOrStdout(), "job %s: intake stopped; it ends once its in-flight groups are written, or within the server's --cancel-grace (30s) by cancelling them (rollout job watch %s)\n", j.Id, j.Id)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "job %s already ended: %s\n", j.Id, stateName(j.State))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&inFlight, "in-flight", false, "also cancel running rollouts (recorded as infra_failed/cancelled)")
	return cmd
}

type watchFlags struct {
	groups bool
	asJSON bool
	wait   time.Duration
}

func (w *watchFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&w.groups, "include-groups", false, "also stream every completed group")
	fl.BoolVar(&w.asJSON, "json", false, "print every event as one JSON line (WatchJobResponse)")
	fl.DurationVar(&w.wait, "reconnect-wait", 2*time.Minute, "keep reconnecting this long while the server is unavailable (e.g. restarting)")
}

func newJobWatchCmd(c *clientFlags) *cobra.Command {
	var w watchFlags
	cmd := &cobra.Command{
		Use:   "watch JOB_ID",
		Short: "Follow a job's progress (and groups) until it ends; exit 1 unless it succeeded",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return watchJob(cmd, c, args[0], w)
		},
	}
	w.add(cmd)
	return cmd
}

// watchJob follows a job to its end. A server restart ends the stream with
// Unavailable; the watch reconnects (the job resumes on the new server)
// for up to --reconnect-wait.
func watchJob(cmd *cobra.Command, c *clientFlags, id string, w watchFlags) error {
	cli, err := c.dial()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	var downSince time.Time
	backoff := 250 * time.Millisecond
	for {
		final, err := watchOnce(ctx, cli, id, w, out)
		if err == nil {
			return jobOutcome(final)
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return rpcError(c.addr, err)
		}
		if downSince.IsZero() {
			downSince = time.Now()
			fmt.Fprintf(cmd.ErrOrStderr(), "server unavailable (%s); reconnecting\n", status.Convert(err).Message())
		} else if time.Since(downSince) > w.wait {
			return rpcError(c.addr, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// watchOnce reads one WatchJob stream; it returns the final job, or the
// error that ended the stream.
func watchOnce(ctx context.Context, cli *server.Client, id string, w watchFlags, out io.Writer) (*rolloutv1.Job, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cli.WatchJob(ctx, &rolloutv1.WatchJobRequest{JobId: id, IncludeGroups: w.groups})
	if err != nil {
		return nil, err
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, status.Error(codes.Unavailable, "watch stream ended before the job did")
		}
		if err != nil {
			return nil, err
		}
		if w.asJSON {
			if err := printJSON(out, ev, false); err != nil {
				return nil, err
			}
		}
		switch e := ev.Event.(type) {
		case *rolloutv1.WatchJobResponse_Progress:
			if !w.asJSON {
				fmt.Fprintf(out, "%s  %s\n", time.Now().Format(time.TimeOnly), progressLine(e.Progress))
			}
		case *rolloutv1.WatchJobResponse_Group:
			if !w.asJSON {
				g := e.Group
				fmt.Fprintf(out, "%s  group %s: %d rollouts, mean %.3f, std %.3f%s\n", time.Now().Format(time.TimeOnly),
					g.GroupId, len(g.Rollouts), g.Mean, g.Std, map[bool]string{true: " (dropped)"}[g.Dropped])
			}
		case *rolloutv1.WatchJobResponse_Finished:
			if !w.asJSON {
				printJob(out, e.Finished)
			}
			return e.Finished, nil
		}
	}
}

func jobOutcome(j *rolloutv1.Job) error {
	switch j.State {
	case rolloutv1.JobState_JOB_STATE_SUCCEEDED:
		return nil
	case rolloutv1.JobState_JOB_STATE_FAILED:
		return fmt.Errorf("job %s failed: %s", j.Id, j.Error)
	}
	return fmt.Errorf("job %s ended %s", j.Id, stateName(j.State))
}

// printJSON writes m as JSON with the .proto field names, indented or as
// one line. (protojson varies its whitespace on purpose; encoding/json
// makes it stable.)
func printJSON(w io.Writer, m proto.Message, indent bool) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if indent {
		err = json.Indent(&buf, b, "", "  ")
	} else {
		err = json.Compact(&buf, b)
	}
	if err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = w.Write(buf.Bytes())
	return err
}

func printJob(w io.Writer, j *rolloutv1.Job) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "job:\t%s\n", j.Id)
	fmt.Fprintf(tw, "state:\t%s\n", stateName(j.State))
	fmt.Fprintf(tw, "mode:\t%s\n", modeName(j.Mode))
	fmt.Fprintf(tw, "env:\t%s\n", j.Env)
	fmt.Fprintf(tw, "output:\t%s\n", j.OutputDir)
	fmt.Fprintf(tw, "progress:\t%s\n", progressLine(j.Progress))
	fmt.Fprintf(tw, "created:\t%s\n", j.CreatedAt.AsTime().Local().Format(time.DateTime))
	if j.FinishedAt != nil {
		fmt.Fprintf(tw, "finished:\t%s\n", j.FinishedAt.AsTime().Local().Format(time.DateTime))
	}
	if j.Resumed > 0 {
		fmt.Fprintf(tw, "resumed:\t%d time(s) after a server restart\n", j.Resumed)
	}
	if j.Error != "" {
		fmt.Fprintf(tw, "error:\t%s\n", j.Error)
	}
	_ = tw.Flush()
}

func progressLine(p *rolloutv1.JobProgress) string {
	s := fmt.Sprintf("groups %s", groupsDone(p))
	if p.GetGroupsSkipped() > 0 || p.GetGroupsDropped() > 0 {
		s += fmt.Sprintf(" (%d already done, %d dropped)", p.GetGroupsSkipped(), p.GetGroupsDropped())
	}
	return s + fmt.Sprintf(", rollouts %d (ok %d, infra_failed %d), mean reward %.3f",
		p.GetRollouts(), p.GetRolloutsOk(), p.GetInfraFailed(), p.GetMeanReward())
}

func groupsDone(p *rolloutv1.JobProgress) string {
	done := p.GetGroupsDone() + p.GetGroupsSkipped()
	if p.GetGroupsTotal() > 0 {
		return fmt.Sprintf("%d/%d", done, p.GetGroupsTotal()+p.GetGroupsSkipped())
	}
	return strconv.Itoa(int(done))
}

func stateName(s rolloutv1.JobState) string {
	return strings.TrimPrefix(s.String(), "JOB_STATE_")
}

func modeName(m rolloutv1.JobMode) string {
	return strings.ToLower(strings.TrimPrefix(m.String(), "JOB_MODE_"))
}

// yamlSet is one override of a config key.
type yamlSet struct {
	path  []string
	value string
	tag   string
}

// setYAML overrides keys of a YAML mapping document, keeping the rest of
// the text's structure (the server decodes it strictly).
func setYAML(text []byte, sets []yamlSet) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("a run config is a YAML mapping")
	}
	for _, s := range sets {
		m := doc.Content[0]
		for i, key := range s.path {
			last := i == len(s.path)-1
			var val *yaml.Node
			for k := 0; k+1 < len(m.Content); k += 2 {
				if m.Content[k].Value == key {
					val = m.Content[k+1]
					break
				}
			}
			if val == nil {
				val = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
				m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, val)
			}
			if last {
				*val = yaml.Node{Kind: yaml.ScalarNode, Tag: s.tag, Value: s.value}
				break
			}
			if val.Kind == yaml.ScalarNode && val.Tag == "!!null" {
				*val = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			}
			if val.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("%s is not a mapping", strings.Join(s.path[:i+1], "."))
			}
			m = val
		}
	}
	return yaml.Marshal(&doc)
}
