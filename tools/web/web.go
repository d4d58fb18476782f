// Package web provides the web_search and web_extract tools over pluggable
// providers. The tools run on the host, never in the sandbox (which stays
// offline): a provider is configured by the user (endpoint, API key taken
// from an environment variable) or is a local corpus file.
//
// Providers:
//   - corpus: a JSONL file of documents {url, title, text}; search ranks
//     documents by query-term matches, extract returns a document by URL.
//   - searxng: a SearXNG instance's JSON API (GET <url>/search?q=…&format=json).
//   - json: a generic JSON search API (GET <url>?<query_param>=…), results
//     read from a configurable array field.
//
// For searxng and json, web_extract fetches the page over HTTP(S) with a
// size cap and converts HTML to text (golang.org/x/net/html). Addresses on
// loopback, private, link-local and unspecified networks are refused unless
// allow_private is set, so a model cannot reach the host's own services.
package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/internal/util/secrets"
	"github.com/rollout-rl/rollout/tools"
)

// Toolset is the toolset of web_search and web_extract.
const Toolset = "web"

// Result is one search hit.
type Result struct {
	Title   string `json:"title"`
	URL     string `json:"url"`
	Snippet string `json:"snippet"`
}

// Page is an extracted page.
type Page struct {
	URL       string `json:"url"`
	Title     string `json:"title,omitempty"`
	Text      string `json:"text"`
	Truncated bool   `json:"truncated,omitempty"`
}

// Provider answers searches and extracts pages.
type Provider interface {
	Search(ctx context.Context, query string, n int) ([]Result, error)
	Extract(ctx context.Context, url string) (Page, error)
}

// ErrConfig wraps every invalid provider configuration.
var ErrConfig = errors.New("invalid web config")

// Config selects and configures a provider (YAML: an env's `web` block).
type Config struct {
	// Provider is corpus, searxng or json.
	Provider string `yaml:"provider" json:"provider"`
	// URL is the searxng base URL or the json search endpoint.
	URL string `yaml:"url,omitempty" json:"url,omitempty"`
	// APIKeyEnv names the environment variable holding the API key (json,
	// searxng); the key is sent in APIKeyHeader (default "Authorization",
	// as "Bearer <key>").
	APIKeyEnv    string `yaml:"api_key_env,omitempty" json:"api_key_env,omitempty"`
	APIKeyHeader string `yaml:"api_key_header,omitempty" json:"api_key_header,omitempty"`
	// QueryParam (json, default "q"), CountParam (json, default none) and
	// the fields of the response: ResultsField (default "results"),
	// TitleField ("title"), URLField ("url"), SnippetField ("snippet").
	QueryParam   string `yaml:"query_param,omitempty" json:"query_param,omitempty"`
	CountParam   string `yaml:"count_param,omitempty" json:"count_param,omitempty"`
	ResultsField string `yaml:"results_field,omitempty" json:"results_field,omitempty"`
	TitleField   string `yaml:"title_field,omitempty" json:"title_field,omitempty"`
	URLField     string `yaml:"url_field,omitempty" json:"url_field,omitempty"`
	SnippetField string `yaml:"snippet_field,omitempty" json:"snippet_field,omitempty"`
	// CorpusPath is the corpus provider's JSONL file; empty means the
	// caller supplies the documents (e.g. an env's embedded corpus).
	CorpusPath string `yaml:"corpus_path,omitempty" json:"corpus_path,omitempty"`
	// MaxResults caps the hits per search (default 5, at most 20).
	MaxResults int `yaml:"max_results,omitempty" json:"max_results,omitempty"`
	// MaxPageBytes caps a fetched page (default 2 MiB); MaxChars caps the
	// extracted text per page (default 20000).
	MaxPageBytes int64 `yaml:"max_page_bytes,omitempty" json:"max_page_bytes,omitempty"`
	MaxChars     int   `yaml:"max_chars,omitempty" json:"max_chars,omitempty"`
	// Timeout bounds one provider request (default 20s).
	Timeout time.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// AllowPrivate lets web_extract reach
	// loopback and private addresses: for local corpora and tests.
	AllowPrivate bool `yaml:"allow_private,omitempty" json:"allow_private,omitempty"`
}

func (c *Config) defaults() {
	if c.MaxResults <= 0 {
		c.MaxResults = 5
	}
	c.MaxResults = min(c.MaxResults, 20)
	if c.MaxPageBytes <= 0 {
		c.MaxPageBytes = 2 << 20
	}
	if c.MaxChars <= 0 {
		c.MaxChars = 20000
	}
	if c.Timeout <= 0 {
		c.Timeout = 20 * time.Second
	}
	if c.QueryParam == "" {
		c.QueryParam = "q"
	}
	if c.ResultsField == "" {
		c.ResultsField = "results"
	}
	if c.TitleField == "" {
		c.TitleField = "title"
	}
	if c.URLField == "" {
		c.URLField = "url"
	}
	if c.SnippetField == "" {
		c.SnippetField = "snippet"
	}
	if c.APIKeyHeader == "" {
		c.APIKeyHeader = "Authorization"
	}
}

// New builds the configured provider. docs are the corpus provider's
// documents when CorpusPath is empty.
func New(c Config, docs []Doc) (Provider, error) {
	c.defaults()
	key := ""
	if c.APIKeyEnv != "" {
		var err error
		if key, err = secrets.Lookup(c.APIKeyEnv); err != nil {
			return nil, fmt.Errorf("%w: api_key_env: %w", ErrConfig, err)
		}
	}
	switch c.Provider {
	case "corpus":
		if c.URL != "" || c.APIKeyEnv != "" {
			return nil, fmt.Errorf("%w: the corpus provider takes corpus_path, not url or api_key_env", ErrConfig)
		}
		if c.CorpusPath != "" {
			var err error
			if docs, err = ReadCorpus(c.CorpusPath); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrConfig, err)
			}
		}
		return NewCorpus(docs, c)
	case "searxng", "json":
		if c.URL == "" {
			return nil, fmt.Errorf("%w: provider %s needs url", ErrConfig, c.Provider)
		}
		if !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://") {
			return nil, fmt.Errorf("%w: url %q must be http(s)", ErrConfig, c.URL)
		}
		return newHTTPProvider(c, key), nil
	case "":
		return nil, fmt.Errorf("%w: provider is required (corpus, searxng, json)", ErrConfig)
	default:
		return nil, fmt.Errorf("%w: unknown provider %q (corpus, searxng, json)", ErrConfig, c.Provider)
	}
}

// maxExtractURLs bounds one web_extract call.
const maxExtractURLs = 5

// Tools returns web_search and web_extract over p. maxResults caps the
// hits of one search.
func Tools(p Provider, maxResults int) []tools.Tool {
	if maxResults <= 0 {
		maxResults = 5
	}
	search := tools.Tool{
		Name:        "web_search",
		Description: "Search the web. Returns a JSON list of results with title, url and snippet.",
		Parameters: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{`+
			`"query":{"type":"string","description":"The search query."},`+
			`"max_results":{"type":"integer","description":"How many results (1-%d)."}},"required":["query"]}`, maxResults)),
		Toolset: Toolset,
		Class:   tools.ReadOnly,
		Handler: func(ctx context.Context, _ *tools.Runtime, args tools.Args) (string, error) {
			q, _ := args["query"].(string)
			q = strings.TrimSpace(q)
			if q == "" {
				return "", errors.New("query is empty")
			}
			n := maxResults
			if v, ok := args["max_results"].(json.Number); ok {
				if i, err := v.Int64(); err == nil && i > 0 {
					n = int(min(i, int64(maxResults)))
				}
			}
			res, err := p.Search(ctx, q, n)
			if err != nil {
				return "", fmt.Errorf("web_search: %w", err)
			}
			if len(res) > n {
				res = res[:n]
			}
			b, _ := json.Marshal(map[string]any{"query": q, "results": res})
			return string(b), nil
		},
	}
	extract := tools.Tool{
		Name:        "web_extract",
		Description: fmt.Sprintf("Fetch web pages and return their text. Give up to %d URLs (e.g. from web_search).", maxExtractURLs),
		Parameters: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{`+
			`"urls":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":%d,"description":"The pages to fetch."}},"required":["urls"]}`, maxExtractURLs)),
		Toolset: Toolset,
		Class:   tools.ReadOnly,
		Handler: func(ctx context.Context, _ *tools.Runtime, args tools.Args) (string, error) {
			raw, _ := args["urls"].([]any)
			type item struct {
				Page
				Error string `json:"error,omitempty"`
			}
			var out []item
			for _, v := range raw {
				u, _ := v.(string)
				pg, err := p.Extract(ctx, strings.TrimSpace(u))
				if err != nil {
					if ctx.Err() != nil {
						return "", ctx.Err()
					}
					out = append(out, item{Page: Page{URL: u}, Error: err.Error()})
					continue
				}
				out = append(out, item{Page: pg})
			}
			b, _ := json.Marshal(map[string]any{"pages": out})
			return string(b), nil
		},
	}
	return []tools.Tool{search, extract}
}
