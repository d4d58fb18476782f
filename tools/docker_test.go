package tools

// The built-in tools against real Docker sandboxes: the Debian image (bash,
// GNU coreutils, ripgrep) and the busybox image (sh, busybox applets, no
// ripgrep: the grep/find fallbacks).

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
)

var (
	dockerOnce sync.Once
	testDocker *docker.Docker
	dockerErr  error
)

func dockerSandbox(t *testing.T, image string) (*Set, *Runtime) {
	t.Helper()
	dockerOnce.Do(func() {
		testDocker, dockerErr = docker.New(context.Background(), docker.Options{Options: host.Options{Instance: "toolstest", ReapInterval: -1}})
	})
	if dockerErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and Docker is not usable: %v", dockerErr)
		}
		t.Skipf("Docker not usable (CI=true makes this a failure): %v", dockerErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := testDocker.Create(ctx, sandbox.Spec{Image: image})
	if err != nil {
		t.Fatalf("create %s: %v", image, err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	set, err := Default().Resolve(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return set, NewRuntime(sb, t.Name())
}

func TestBuiltinsInDocker(t *testing.T) {
	for _, image := range []string{"rollout-sandbox:bookworm", "rollout-sandbox:busybox"} {
		t.Run(image, func(t *testing.T) {
			set, rt := dockerSandbox(t, image)
			do := func(name, args string) map[string]any {
				t.Helper()
				return call(t, set, rt, name, args)
			}
			r := do("terminal", `{"command":"mkdir -p proj/src && cd proj && export GREETING=hi"}`)
			if r["exit_code"] != float64(0) {
				t.Fatalf("terminal: %v", r)
			}
			r = do("write_file", `{"path":"src/app.txt","content":"alpha\nbeta TODO\ngamma\n"}`)
			if r["bytes_written"] != float64(22) {
				t.Fatalf("write relative to the session cwd: %v", r)
			}
			r = do("terminal", `{"command":"echo $GREETING; cat src/app.txt | wc -l"}`)
			if !strings.HasPrefix(r["output"].(string), "hi\n") || !strings.HasSuffix(r["output"].(string), "3") {
				t.Fatalf("cwd/env persistence: %v", r)
			}
			r = do("read_file", `{"path":"src/app.txt","offset":2,"limit":1}`)
			if r["content"] != "     2|beta TODO" || r["total_lines"] != float64(3) || r["truncated"] != true {
				t.Fatalf("read_file: %v", r)
			}
			r = do("read_file", `{"path":"src/ap.txt"}`)
			if !strings.HasPrefix(r["error"].(string), "File not found: ") || len(r["similar_files"].([]any)) != 1 {
				t.Fatalf("missing file: %v", r)
			}
			r = do("patch", `{"mode":"replace","path":"src/app.txt","old_string":"beta","new_string":"BETA"}`)
			if r["success"] != true || !strings.Contains(r["diff"].(string), "+BETA TODO") {
				t.Fatalf("patch: %v", r)
			}
			r = do("search_files", `{"pattern":"TODO","path":"."}`)
			ms, _ := r["matches"].([]any)
			if r["total_count"] != float64(1) || len(ms) != 1 || ms[0].(map[string]any)["line"] != float64(2) {
				t.Fatalf("search content: %v", r)
			}
			r = do("search_files", `{"pattern":"*.txt","target":"files"}`)
			if r["total_count"] != float64(1) || !strings.HasSuffix(r["files"].([]any)[0].(string), "/proj/src/app.txt") {
				t.Fatalf("search files: %v", r)
			}
			r = do("terminal", `{"command":"for i in 1 2 3; do echo tick $i; sleep 0.2; done","background":true}`)
			id, _ := r["session_id"].(string)
			if id == "" {
				t.Fatalf("background: %v", r)
			}
			r = do("process", `{"action":"wait","session_id":"`+id+`","timeout":30}`)
			if r["timed_out"] != false || !strings.Contains(r["output"].(string), "tick 3") {
				t.Fatalf("wait: %v", r)
			}
			r = do("terminal", `{"command":"cat; echo eof-seen","background":true}`)
			id = r["session_id"].(string)
			do("process", `{"action":"submit","session_id":"`+id+`","data":"line"}`)
			if r = do("process", `{"action":"close","session_id":"`+id+`"}`); r["success"] != true {
				t.Fatalf("close: %v", r)
			}
			r = do("process", `{"action":"wait","session_id":"`+id+`","timeout":30}`)
			if r["timed_out"] != false || r["output"] != "line\neof-seen" {
				t.Fatalf("stdin round trip: %v", r)
			}
			r = do("terminal", `{"command":"sleep 10","timeout":1}`)
			if r["exit_code"] != float64(124) {
				t.Fatalf("timeout: %v", r)
			}
			// A file name full of shell syntax stays a name.
			r = do("write_file", `{"path":"/tmp/x;touch /tmp/pwned'$(id)","content":"ok"}`)
			if r["bytes_written"] != float64(2) {
				t.Fatalf("odd name: %v", r)
			}
			r = do("terminal", `{"command":"ls /tmp/pwned 2>&1 || echo absent"}`)
			if !strings.Contains(r["output"].(string), "absent") {
				t.Fatalf("a path reached a shell: %v", r)
			}
		})
	}
}

func TestSearchAlwaysValidJSONInDocker(t *testing.T) {
	set, rt := dockerSandbox(t, "rollout-sandbox:bookworm")
	var b strings.Builder
	for i := 0; i < 300; i++ {
		b.WriteString("needle line\n")
	}
	if _, err := set.Execute(context.Background(), rt, mustPrep(t, set, "write_file", `{"path":"/workspace/n.txt","content":`+jsonString(b.String())+`}`)); err != nil {
		t.Fatal(err)
	}
	out, err := set.Execute(context.Background(), rt, mustPrep(t, set, "search_files", `{"pattern":"needle","path":"/workspace","limit":5}`))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out.Content), &v); err != nil {
		t.Fatalf("truncated search is not JSON: %v\n%s", err, out.Content)
	}
	if v["truncated"] != true || v["total_count"] != float64(300) || !strings.Contains(v["hint"].(string), "offset=5") {
		t.Fatalf("%v", v)
	}
}

func mustPrep(t *testing.T, set *Set, name, args string) *Call {
	t.Helper()
	c, err := set.Prepare("c", name, args)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
