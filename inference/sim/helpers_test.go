package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

var fixedNow = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

// startSim starts a simulator closed at test end.
func startSim(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = fixedNow
	}
	srv, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start simulator: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// post sends a JSON body and returns the status and body.
func post(t testing.TB, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, b
}

func get(t testing.TB, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, b
}

// decode unmarshals a response body or fails the test.
func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", truncate(b), err)
	}
	return v
}

func truncate(b []byte) string {
	if len(b) > 400 {
		return string(b[:400]) + "…"
	}
	return string(b)
}

// golden compares got with testdata/name, rewriting it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden %s (run with -update to create): %v", path, err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

const terminalTool = `{"type":"function","function":{"name":"terminal","description":"Run a shell command","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}`

func httpPost(url, contentType, body string) (int, error) {
	resp, err := http.Post(url, contentType, bytes.NewBufferString(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// compactJSON pretty-prints a JSON document with one key per line but
// arrays of scalars on a single line, so goldens of token lists stay short.
func compactJSON(t testing.TB, raw []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("response is not JSON: %v: %s", err, truncate(raw))
	}
	var b bytes.Buffer
	writeCompact(&b, v, "")
	b.WriteByte('\n')
	return b.Bytes()
}

func writeCompact(b *bytes.Buffer, v any, indent string) {
	enc := func(x any) {
		e := json.NewEncoder(b)
		e.SetEscapeHTML(false)
		_ = e.Encode(x)
		b.Truncate(b.Len() - 1)
	}
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			b.WriteString("{}")
			return
		}
		keys := sortedArgKeys(x)
		b.WriteString("{\n")
		for i, k := range keys {
			b.WriteString(indent + "  ")
			enc(k)
			b.WriteString(": ")
			writeCompact(b, x[k], indent+"  ")
			if i < len(keys)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "}")
	case []any:
		scalar := true
		for _, e := range x {
			switch e.(type) {
			case map[string]any, []any:
				scalar = false
			}
		}
		if scalar {
			enc(x)
			return
		}
		b.WriteString("[\n")
		for i, e := range x {
			b.WriteString(indent + "  ")
			writeCompact(b, e, indent+"  ")
			if i < len(x)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "]")
	default:
		enc(x)
	}
}
