package envs_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/envs"
	_ "github.com/rollout-rl/rollout/envs/protocol/builtin"
	"github.com/rollout-rl/rollout/internal/testkit/envservertest"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

func envServerSpec(url string) envs.YAMLSpec {
	return envs.YAMLSpec{Name: "counter", Prompt: "Count.", Items: []map[string]any{{"id": "a", "seed": 12}},
		EnvServer: &envs.YAMLEnvServer{Protocol: "openenv", URL: url, CallTimeout: "10s"}}
}

func TestEnvServerConfig(t *testing.T) {
	for name, mod := range map[string]func(*envs.YAMLSpec){
		"no protocol":      func(s *envs.YAMLSpec) { s.EnvServer.Protocol = "" },
		"unknown protocol": func(s *envs.YAMLSpec) { s.EnvServer.Protocol = "gym" },
		"image and url":    func(s *envs.YAMLSpec) { s.EnvServer.Image = "x" },
		"neither":          func(s *envs.YAMLSpec) { s.EnvServer.URL = "" },
		"image without command": func(s *envs.YAMLSpec) {
			s.EnvServer.URL, s.EnvServer.Image, s.EnvServer.Port = "", "img", 8000
		},
		"image without port": func(s *envs.YAMLSpec) {
			s.EnvServer.URL, s.EnvServer.Image, s.EnvServer.Command = "", "img", "serve"
		},
		"url with command": func(s *envs.YAMLSpec) { s.EnvServer.Command = "serve" },
		"not http":         func(s *envs.YAMLSpec) { s.EnvServer.URL = "ftp://x" },
		"bad timeout":      func(s *envs.YAMLSpec) { s.EnvServer.CallTimeout = "-1s" },
		"rewards too":      func(s *envs.YAMLSpec) { s.Rewards = []rewards.Spec{{Type: "contains", Want: "x"}} },
		"sandbox too":      func(s *envs.YAMLSpec) { s.Sandbox = &envs.YAMLSandbox{Image: "x"} },
		"no prompt":        func(s *envs.YAMLSpec) { s.Prompt = "" },
	} {
		spec := envServerSpec("http://127.0.0.1:1")
		mod(&spec)
		if _, err := envs.NewYAMLEnv(spec, t.TempDir()); !errors.Is(err, envs.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	// A NeMo Gym env needs no prompt: its rows carry their input.
	spec := envServerSpec("http://127.0.0.1:1")
	spec.Prompt, spec.EnvServer.Protocol = "", "nemo_gym"
	spec.Items = []map[string]any{{"responses_create_params": map[string]any{"input": "hello"}}}
	e, err := envs.NewYAMLEnv(spec, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	items, err := e.Items(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	task, err := e.Task(context.Background(), items[0])
	if err != nil || len(task.Messages) != 1 || task.Messages[0].Content != "hello" {
		t.Fatalf("task %+v, %v: want the row's input", task.Messages, err)
	}
	// An image server runs as the rollout's sandbox.
	spec = envServerSpec("")
	spec.EnvServer.Image, spec.EnvServer.Command, spec.EnvServer.Port = "srv:1", "serve", 8000
	e, err = envs.NewYAMLEnv(spec, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	items, _ = e.Items(context.Background(), "")
	if task, err := e.Task(context.Background(), items[0]); err != nil || task.Sandbox == nil || task.Sandbox.Image != "srv:1" {
		t.Fatalf("task sandbox %+v, %v", task.Sandbox, err)
	}
}

// An env_server env over a running OpenEnv server (url): its tools run on
// the server, the responder ends the episode at done with the turns'
// step rewards, the reward is the server's.
func TestEnvServerSession(t *testing.T) {
	srv := httptest.NewServer(envservertest.OpenEnvHandler(envservertest.OpenEnvOptions{StepsToDone: 2}))
	defer srv.Close()
	e, err := envs.NewYAMLEnv(envServerSpec(srv.URL), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	items, err := e.Items(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	task, err := e.Task(ctx, items[0])
	if err != nil {
		t.Fatal(err)
	}
	if task.Sandbox != nil {
		t.Fatal("a url server needs no sandbox")
	}
	sess, err := e.OpenSession(ctx, items[0], "ro_1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(context.Background())
	if op := sess.Opening(); len(op) != 1 || !strings.Contains(op[0].Content, "starts at 2") {
		t.Fatalf("opening %+v", op)
	}
	byName := map[string]tools.Tool{}
	for _, tl := range sess.Tools() {
		byName[tl.Name] = tl
	}
	add, ok := byName["add"]
	if !ok || add.Toolset != envs.EnvServerToolset {
		t.Fatalf("tools %v", byName)
	}
	resp := sess.Responder()
	out, err := add.Handler(ctx, nil, tools.Args{"n": 1})
	if err != nil || !strings.Contains(out, "counter is now 3") {
		t.Fatalf("add: %q, %v", out, err)
	}
	if _, err := add.Handler(ctx, nil, tools.Args{"n": 9}); err == nil || errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("add 9: %v, want a tool error for the model", err)
	}
	fb, err := resp.Respond(ctx, 1, nil)
	if err != nil || fb.Done || fb.Reward == nil || *fb.Reward != 0.25 {
		t.Fatalf("turn 1 feedback %+v, %v: want reward 0.25, not done", fb, err)
	}
	if out, err := add.Handler(ctx, nil, tools.Args{"n": 3}); err != nil || !strings.Contains(out, "done") {
		t.Fatalf("add 3: %q, %v", out, err)
	}
	if _, err := add.Handler(ctx, nil, tools.Args{"n": 1}); err == nil || !strings.Contains(err.Error(), "episode is over") {
		t.Fatalf("a step after done: %v", err)
	}
	fb, err = resp.Respond(ctx, 2, nil)
	if err != nil || !fb.Done || *fb.Reward != 1.25 {
		t.Fatalf("turn 2 feedback %+v, %v: want done with 1.25", fb, err)
	}
	sc, err := e.Reward(ctx, items[0], envs.Outcome{Session: sess, Messages: []openai.ChatCompletionMessage{}}, nil)
	if err != nil || sc.Value != 1.5 || sc.Components["env_done"] != 1 || sc.Components["env_steps"] != 3 {
		t.Fatalf("reward %+v, %v", sc, err)
	}
	if _, err := e.Reward(ctx, items[0], envs.Outcome{}, nil); err == nil {
		t.Fatal("a reward without a session must fail, not score 0")
	}
}

// A server that dies mid-episode fails the call as the sandbox class,
// naming the server: the rollout is an infrastructure failure.
func TestEnvServerDies(t *testing.T) {
	srv := httptest.NewServer(envservertest.OpenEnvHandler(envservertest.OpenEnvOptions{DieAfterSteps: 1}))
	defer srv.Close()
	e, err := envs.NewYAMLEnv(envServerSpec(srv.URL), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	items, _ := e.Items(ctx, "")
	sess, err := e.OpenSession(ctx, items[0], "ro_1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	_, err = sess.Tools()[0].Handler(ctx, nil, tools.Args{"n": 1})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "openenv server "+srv.URL) {
		t.Fatalf("err %v: want sandbox unavailable naming the server", err)
	}
	srv.Close()
	if _, err := e.OpenSession(ctx, items[0], "ro_2", nil); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("open against a dead server: %v, want sandbox unavailable", err)
	}
}
