package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/devtools/engine"
	"github.com/rollout-rl/rollout/internal/testkit/proctest"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox/image"
)

func TestEngineLlamacppCmd(t *testing.T) {
	t.Run("bad options", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", deadDockerHost)
		_, msg, code := runRolloutCmd(t, "engine", "llamacpp", "--nope")
		if code != 2 || !strings.Contains(msg, "unknown flag: --nope") {
			t.Errorf("exit %d, %q; want 2 for an unknown flag", code, msg)
		}
	})

	t.Run("serves until cancelled", func(t *testing.T) {
		requireDockerForCLI(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cli, err := dockerclient.New(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		if _, err := cli.ImageInspect(ctx, image.Ref("llamacpp")); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI=true and %s is missing: %v", image.Ref("llamacpp"), err)
			}
			t.Skipf("%s missing (rollout sandbox image build --name llamacpp): %v", image.Ref("llamacpp"), err)
		}

		root := newRootCmd()
		var out proctest.Buffer
		root.SetArgs([]string{"engine", "llamacpp", "--port", "0", "--slots", "2", "--ctx", "8192"})
		root.SetOut(&out)
		root.SetErr(&out)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- root.ExecuteContext(runCtx) }()

		ready := regexp.MustCompile(`llama-server ready at (http://127\.0\.0\.1:\d+) .*container ([0-9a-f]{12})`)
		var m []string
		for m == nil {
			select {
			case err := <-done:
				stop()
				t.Fatalf("command returned before it was ready: %v\n%s", err, out.String())
			case <-time.After(100 * time.Millisecond):
			}
			m = ready.FindStringSubmatch(out.String())
		}
		if !strings.Contains(out.String(), "-c 8192 -np 2") {
			t.Errorf("command line not printed with the flags:\n%s", out.String())
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := hc.Get(m[1] + "/health")
		if err != nil {
			stop()
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"ok"`) {
			t.Errorf("/health: %d %s", resp.StatusCode, body)
		}

		stop()
		if err := <-done; err != nil {
			t.Fatalf("command: %v\n%s", err, out.String())
		}
		if !strings.HasSuffix(out.String(), "stopped\n") {
			t.Errorf("output does not end with stopped:\n%s", out.String())
		}
		res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true,
			Filters: make(client.Filters).Add("label", engine.LabelEngine+"=llamacpp").Add("id", m[2])})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Items) != 0 {
			t.Errorf("container %s still exists after the command stopped", m[2])
		}
	})
}
