package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/tools"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeWeb is a searxng-style search API and the pages it finds, served on
// loopback by the test.
func fakeWeb(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	var srv *httptest.Server
	mux.HandleFunc("/search", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("format") != "json" {
			http.Error(w, "format", 400)
			return
		}
		q := r.URL.Query().Get("q")
		res := []map[string]string{}
		if strings.Contains(q, "lake") {
			res = append(res, map[string]string{"title": "Lake Varn", "url": srv.URL + "/page/lake", "content": "A glacial lake."})
		}
		res = append(res, map[string]string{"title": "Other", "url": srv.URL + "/page/other", "content": "Unrelated."})
		_ = json.NewEncoder(w).Encode(map[string]any{"query": q, "results": res})
	})
	mux.HandleFunc("/api", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Key") != "s3cret" {
			http.Error(w, "no key", 401)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"hits": []map[string]string{
			{"name": "Hit " + r.URL.Query().Get("query"), "link": srv.URL + "/page/lake", "desc": "d"}}})
	})
	mux.HandleFunc("/page/lake", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<!doctype html><html><head><title>Lake  Varn</title><style>p{color:red}</style>
<script>var secret = "do not show";</script></head><body><h1>Lake Varn</h1><p>Maximum depth:
<b>212</b> metres.</p><noscript>enable js</noscript><ul><li>one</li><li>two</li></ul></body></html>`)
	})
	mux.HandleFunc("/page/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, strings.Repeat("x", 5000))
	})
	mux.HandleFunc("/page/bin", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write([]byte{0, 1, 2})
	})
	srv = httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func call(t *testing.T, tl tools.Tool, args tools.Args) (string, error) {
	t.Helper()
	return tl.Handler(context.Background(), nil, args)
}

func TestSearxngSearchAndExtract(t *testing.T) {
	srv := fakeWeb(t)
	p, err := New(Config{Provider: "searxng", URL: srv.URL, AllowPrivate: true, MaxPageBytes: 1000, MaxChars: 300}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := Tools(p, 5)
	out, err := call(t, ts[0], tools.Args{"query": "lake depth"})
	if err != nil {
		t.Fatal(err)
	}
	var sr struct{ Results []Result }
	if err := json.Unmarshal([]byte(out), &sr); err != nil || len(sr.Results) != 2 || sr.Results[0].URL != srv.URL+"/page/lake" {
		t.Fatalf("search: %s %v", out, err)
	}
	out, err = call(t, ts[0], tools.Args{"query": "lake", "max_results": json.Number("1")})
	if err != nil || strings.Count(out, `"url"`) != 1 {
		t.Fatalf("max_results: %s %v", out, err)
	}
	out, err = call(t, ts[1], tools.Args{"urls": []any{srv.URL + "/page/lake", srv.URL + "/page/big", srv.URL + "/page/bin", "file:///etc/passwd"}})
	if err != nil {
		t.Fatal(err)
	}
	var er struct {
		Pages []struct {
			Page
			Error string
		}
	}
	if err := json.Unmarshal([]byte(out), &er); err != nil || len(er.Pages) != 4 {
		t.Fatalf("extract: %s %v", out, err)
	}
	lake := er.Pages[0]
	if lake.Title != "Lake Varn" || !strings.Contains(lake.Text, "Maximum depth: 212 metres.") || strings.Contains(lake.Text, "secret") ||
		strings.Contains(lake.Text, "color") || strings.Contains(lake.Text, "enable js") || !strings.Contains(lake.Text, "one\ntwo") {
		t.Errorf("html text: %+v", lake)
	}
	if big := er.Pages[1]; !big.Truncated || len(big.Text) != 300 {
		t.Errorf("size caps: truncated=%v len=%d", big.Truncated, len(big.Text))
	}
	if !strings.Contains(er.Pages[2].Error, "unsupported content type") || !strings.Contains(er.Pages[3].Error, "not an http(s) URL") {
		t.Errorf("errors: %q %q", er.Pages[2].Error, er.Pages[3].Error)
	}
}

func TestExtractRefusesPrivateAddresses(t *testing.T) {
	srv := fakeWeb(t)
	p, err := New(Config{Provider: "searxng", URL: srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The user-configured search endpoint may be local…
	if res, err := p.Search(context.Background(), "lake", 3); err != nil || len(res) == 0 {
		t.Fatalf("search on a local endpoint: %v %v", res, err)
	}
	// …but the model's URLs may not reach loopback.
	if _, err := p.Extract(context.Background(), srv.URL+"/page/lake"); !errors.Is(err, errPrivate) {
		t.Fatalf("loopback extract: %v", err)
	}
}

func TestJSONProvider(t *testing.T) {
	srv := fakeWeb(t)
	t.Setenv("TEST_WEB_KEY", "s3cret")
	c := Config{Provider: "json", URL: srv.URL + "/api", APIKeyEnv: "TEST_WEB_KEY", APIKeyHeader: "X-Key", QueryParam: "query",
		ResultsField: "hits", TitleField: "name", URLField: "link", SnippetField: "desc"}
	p, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Search(context.Background(), "varn", 3)
	if err != nil || len(res) != 1 || res[0].Title != "Hit varn" || res[0].Snippet != "d" {
		t.Fatalf("json search: %+v %v", res, err)
	}
	t.Setenv("TEST_WEB_KEY", "wrong")
	p, _ = New(c, nil)
	if _, err := p.Search(context.Background(), "varn", 3); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("bad key: %v", err)
	}
}

func TestCorpusProvider(t *testing.T) {
	docs, err := ParseCorpus(strings.NewReader(`{"url":"u1","title":"Lake Varn","text":"deep lake 212 m"}
{"url":"u2","title":"Orrin","text":"a town by the lake founded 1187"}
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Provider: "corpus", MaxChars: 5}, docs)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Search(context.Background(), "Orrin founded", 5)
	if err != nil || len(res) != 1 || res[0].URL != "u2" {
		t.Fatalf("search %+v %v", res, err)
	}
	res, _ = p.Search(context.Background(), "varn lake", 5)
	if len(res) != 2 || res[0].URL != "u1" {
		t.Fatalf("ranking %+v", res)
	}
	pg, err := p.Extract(context.Background(), "u1")
	if err != nil || pg.Text != "deep " || !pg.Truncated {
		t.Fatalf("extract %+v %v", pg, err)
	}
	if _, err := p.Extract(context.Background(), "u3"); err == nil {
		t.Fatal("unknown url extracted")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "provider is required"},
		{Config{Provider: "bing"}, "unknown provider"},
		{Config{Provider: "searxng"}, "needs url"},
		{Config{Provider: "json", URL: "ftp://x"}, "must be http"},
		{Config{Provider: "json", URL: "http://x", APIKeyEnv: "ROLLOUT_TEST_UNSET_KEY"}, "ROLLOUT_TEST_UNSET_KEY is empty"},
		{Config{Provider: "corpus"}, "corpus is empty"},
		{Config{Provider: "corpus", CorpusPath: "/nonexistent.jsonl"}, "no such file"},
	} {
		if _, err := New(c.cfg, nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := ParseCorpus(strings.NewReader(`{"url":"u","text":"t","extra":1}`), "x"); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("unknown field: %v", err)
	}
}
