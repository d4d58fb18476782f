package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The test binary stands in for the agent's binary: the reset runs
	// /proc/self/exe -ipc-clean, and the namespaced reset test (see
	// reset_test.go) runs it as the container's init.
	if len(os.Args) == 2 && os.Args[1] == ipcCleanFlag {
		os.Exit(Main(os.Args[1:]))
	}
	if os.Getenv(e2eRoleEnv) == "init" {
		os.Exit(e2eInit())
	}
	goleak.VerifyTestMain(m)
}

func TestCapBuf(t *testing.T) {
	tests := []struct {
		name   string
		limit  int
		writes []string
		want   string
		total  int64
		trunc  bool
	}{
		{"fits", 10, []string{"abc", "def"}, "abcdef", 6, false},
		{"exact", 6, []string{"abcdef"}, "abcdef", 6, false},
		{"head and tail", 6, []string{"abcdefghij"}, "abchij", 10, true},
		{"many small", 4, []string{"a", "b", "c", "d", "e", "f"}, "abef", 6, true},
		{"big tail chunk", 4, []string{"ab", "cdefghij", "k"}, "abjk", 11, true},
		{"zero", 0, []string{"abc"}, "", 3, true},
		{"odd", 5, []string{"0123456789"}, "01789", 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newCapBuf(tt.limit)
			for _, w := range tt.writes {
				_, _ = b.Write([]byte(w))
			}
			got, total, trunc := b.bytes()
			if string(got) != tt.want || total != tt.total || trunc != tt.trunc {
				t.Fatalf("got %q %d %v, want %q %d %v", got, total, trunc, tt.want, tt.total, tt.trunc)
			}
		})
	}
}

// FuzzCapBuf checks that any chunking keeps exactly the head and the tail.
func FuzzCapBuf(f *testing.F) {
	f.Add([]byte("hello world, this is a stream"), uint8(7), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, limit, chunk uint8) {
		b := newCapBuf(int(limit))
		step := int(chunk)%17 + 1
		for i := 0; i < len(data); i += step {
			_, _ = b.Write(data[i:min(i+step, len(data))])
		}
		got, total, trunc := b.bytes()
		want := data
		if len(data) > int(limit) {
			h := int(limit) / 2
			want = append(append([]byte(nil), data[:h]...), data[len(data)-(int(limit)-h):]...)
		}
		if !bytes.Equal(got, want) || total != int64(len(data)) || trunc != (len(data) > int(limit)) {
			t.Fatalf("limit %d step %d: got %q want %q", limit, step, got, want)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	_ = WriteFrame(&buf, FrameRequest, 7, []byte(`{"op":"ping"}`))
	f.Add(buf.Bytes())
	f.Add([]byte{'Q', 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{'Z', 0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := ReadFrame(bytes.NewReader(data))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := WriteFrame(&out, fr.Type, fr.ID, fr.Payload); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), data[:out.Len()]) {
			t.Fatalf("round trip differs")
		}
	})
}

func TestWithin(t *testing.T) {
	tests := []struct {
		name, want string
		bad        bool
	}{
		{"a/b", "/r/a/b", false},
		{"./a", "/r/a", false},
		{".", "/r", false},
		{"../x", "", true},
		{"a/../../x", "", true},
		{"/etc/passwd", "", true},
	}
	for _, tt := range tests {
		got, err := within("/r", tt.name)
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("within(%q) = %q, %v", tt.name, got, err)
		}
	}
}

// client drives a server over in-memory pipes.
type client struct {
	t   *testing.T
	w   io.Writer
	r   io.Reader
	seq uint32
}

func startServer(t *testing.T) *client {
	dir := t.TempDir()
	return startServerWith(t, func(s *server) error { return s.setup("", "", false, dir) })
}

// startServerWith is startServer with its own set-up of the server.
func startServerWith(t *testing.T, setup func(*server) error) *client {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := newServer(outW)
	if err := setup(s); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = s.serve(inR)
		s.shutdown()
		_ = outW.Close()
		close(done)
	}()
	c := &client{t: t, w: inW, r: outR}
	t.Cleanup(func() {
		_ = inW.Close()
		go func() { _, _ = io.Copy(io.Discard, outR) }()
		<-done
	})
	return c
}

// call sends req (+ data) and returns the streamed bytes and the response.
func (c *client) call(req Request, data []byte) ([]byte, Response) {
	c.t.Helper()
	c.seq++
	id := c.seq
	b, _ := json.Marshal(req)
	if err := WriteFrame(c.w, FrameRequest, id, b); err != nil {
		c.t.Fatal(err)
	}
	if data != nil {
		for len(data) > 0 {
			n := min(len(data), ChunkSize)
			_ = WriteFrame(c.w, FrameData, id, data[:n])
			data = data[n:]
		}
		_ = WriteFrame(c.w, FrameEnd, id, nil)
	}
	var got []byte
	for {
		f, err := ReadFrame(c.r)
		if err != nil {
			c.t.Fatal(err)
		}
		if f.ID != id {
			continue
		}
		switch f.Type {
		case FrameData:
			got = append(got, f.Payload...)
		case FrameResponse:
			var resp Response
			if err := json.Unmarshal(f.Payload, &resp); err != nil {
				c.t.Fatal(err)
			}
			return got, resp
		}
	}
}

func TestServer(t *testing.T) {
	c := startServer(t)
	_, resp := c.call(Request{Op: OpExec, Exec: &ExecSpec{Argv: []string{"echo", "hi"}}}, nil)
	if resp.Exec == nil || string(resp.Exec.Stdout) != "hi\n" {
		t.Fatalf("exec: %+v", resp)
	}
	_, resp = c.call(Request{Op: OpExec, Exec: &ExecSpec{Command: "mkdir -p d && cd d && export V=1", Shell: true}}, nil)
	if resp.Err != "" || resp.Exec.ExitCode != 0 {
		t.Fatalf("shell: %+v", resp)
	}
	_, resp = c.call(Request{Op: OpExec, Exec: &ExecSpec{Command: `echo "$(basename "$PWD") $V"`, Shell: true}}, nil)
	if string(resp.Exec.Stdout) != "d 1\n" {
		t.Fatalf("shell state: %q %q", resp.Exec.Stdout, resp.Exec.Stderr)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "f.bin")
	data := bytes.Repeat([]byte{0, 1, 2, 0xff}, 50000)
	if _, resp = c.call(Request{Op: OpWrite, Path: p, Mode: 0o640}, data); resp.Err != "" || resp.Size != int64(len(data)) {
		t.Fatalf("write: %+v", resp)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode: %v %v", fi.Mode(), err)
	}
	got, resp := c.call(Request{Op: OpRead, Path: p}, nil)
	if resp.Err != "" || !bytes.Equal(got, data) {
		t.Fatalf("read: %d bytes %+v", len(got), resp)
	}
	_, resp = c.call(Request{Op: OpRead, Path: filepath.Join(dir, "nope")}, nil)
	if resp.Code != CodeNotFound {
		t.Fatalf("missing: %+v", resp)
	}
	for _, req := range []Request{{Op: "bogus"}, {Op: OpExec}, {Op: OpRead, Path: "rel"}, {Op: OpExec, Exec: &ExecSpec{Argv: []string{"x"}, Command: "x"}}} {
		if _, resp = c.call(req, nil); resp.Code != CodeInvalid {
			t.Errorf("%+v: %+v", req, resp)
		}
	}
}

func TestShellScriptQuoting(t *testing.T) {
	s := shellScript(map[string]string{"A": "it's $x"}, true)
	if !strings.Contains(s, `export A='it'\''s $x'`) {
		t.Fatalf("quoting:\n%s", s)
	}
	if _, err := lookupUser("no-such-user-xyz"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("lookupUser: %v", err)
	}
	if u, err := lookupUser("0"); err != nil || u.uid != 0 {
		t.Fatalf("lookupUser(0): %+v %v", u, err)
	}
	var ce *codedError
	if !errors.As(invalidf("x"), &ce) || ce.code != CodeInvalid {
		t.Fatal("invalidf")
	}
}

// OpPipe streams stdin in and stdout out; the response carries the exit
// code and stderr.
func TestPipe(t *testing.T) {
	c := startServer(t)
	data := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 60000) // several chunks both ways
	got, resp := c.call(Request{Op: OpPipe, Exec: &ExecSpec{Argv: []string{"cat"}}}, data)
	if resp.Err != "" || resp.Exec == nil || resp.Exec.ExitCode != 0 || !bytes.Equal(got, data) {
		t.Fatalf("cat: %d bytes back of %d, %+v", len(got), len(data), resp)
	}
	got, resp = c.call(Request{Op: OpPipe, Exec: &ExecSpec{Command: "read x; echo got $x; echo oops >&2; exit 3"}}, []byte("hi\n"))
	if string(got) != "got hi\n" || resp.Exec == nil || resp.Exec.ExitCode != 3 || string(resp.Exec.Stderr) != "oops\n" {
		t.Fatalf("exit: %q %+v", got, resp)
	}
	for _, spec := range []*ExecSpec{nil, {Command: "x", Shell: true}, {Argv: []string{"cat"}, TimeoutNS: 1}} {
		if _, resp = c.call(Request{Op: OpPipe, Exec: spec}, nil); resp.Code != CodeInvalid {
			t.Errorf("%+v: %+v", spec, resp)
		}
	}
}
