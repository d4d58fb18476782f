package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"

	"github.com/rollout-rl/rollout/internal/util/netpolicy"
)

// errPrivate is returned for addresses refused without allow_private.
var errPrivate = errors.New("address is loopback, private or link-local (allow_private is off)")

// httpProvider: search goes to the configured endpoint (trusted: the user
// named it, so it may be local); extraction goes to URLs the model chose
// and is restricted to public addresses unless allow_private is set.
type httpProvider struct {
	cfg     Config
	key     string
	search  *http.Client
	extract *http.Client
}

func newHTTPProvider(c Config, key string) *httpProvider {
	return &httpProvider{cfg: c, key: key, search: newClient(c, true), extract: newClient(c, c.AllowPrivate)}
}

func newClient(c Config, allowPrivate bool) *http.Client {
	d := &net.Dialer{}
	if !allowPrivate {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			ip := net.ParseIP(host)
			if ip == nil || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
				ip.IsUnspecified() || ip.IsInterfaceLocalMulticast() {
				return fmt.Errorf("%s: %w", host, errPrivate)
			}
			return nil
		}
	}
	// The served job's network policy (internal/util/netpolicy), when it
	// has one, applies on top of allow_private.
	tr := &http.Transport{DialContext: netpolicy.Dialer(d), Proxy: nil, MaxIdleConnsPerHost: 4}
	return &http.Client{Transport: tr, Timeout: c.Timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("too many redirects")
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s refused", req.URL.Scheme)
			}
			return nil
		}}
}

// Search implements Provider.
func (p *httpProvider) Search(ctx context.Context, query string, n int) ([]Result, error) {
	u, err := url.Parse(p.cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("search url: %w", err)
	}
	q := u.Query()
	fields := [3]string{p.cfg.TitleField, p.cfg.URLField, p.cfg.SnippetField}
	results := p.cfg.ResultsField
	if p.cfg.Provider == "searxng" {
		u = u.JoinPath("search")
		q.Set("q", query)
		q.Set("format", "json")
		fields, results = [3]string{"title", "url", "content"}, "results"
	} else {
		q.Set(p.cfg.QueryParam, query)
		if p.cfg.CountParam != "" {
			q.Set(p.cfg.CountParam, strconv.Itoa(n))
		}
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if p.key != "" {
		v := p.key
		if strings.EqualFold(p.cfg.APIKeyHeader, "Authorization") {
			v = "Bearer " + v
		}
		req.Header.Set(p.cfg.APIKeyHeader, v)
	}
	resp, err := p.search.Do(req)
	if err != nil {
		return nil, fmt.Errorf("search request: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.cfg.MaxPageBytes))
	if err != nil {
		return nil, fmt.Errorf("search response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("search: HTTP %d: %s", resp.StatusCode, clip(string(body), 200))
	}
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("search response is not a JSON object: %w", err)
	}
	arr, ok := doc[results].([]any)
	if !ok {
		return nil, fmt.Errorf("search response has no %q array", results)
	}
	var out []Result
	for _, v := range arr {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		s := func(k string) string { x, _ := m[k].(string); return x }
		r := Result{Title: s(fields[0]), URL: s(fields[1]), Snippet: clip(s(fields[2]), 500)}
		if r.URL == "" {
			continue
		}
		out = append(out, r)
		if len(out) == n {
			break
		}
	}
	return out, nil
}

// Extract implements Provider: GET the page, HTML or plain text only.
func (p *httpProvider) Extract(ctx context.Context, raw string) (Page, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Page{}, fmt.Errorf("%q is not an http(s) URL", raw)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Page{}, err
	}
	req.Header.Set("Accept", "text/html, text/plain;q=0.9")
	resp, err := p.extract.Do(req)
	if err != nil {
		return Page{}, fmt.Errorf("fetch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Page{}, fmt.Errorf("fetch: HTTP %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.cfg.MaxPageBytes+1))
	if err != nil {
		return Page{}, fmt.Errorf("fetch: %w", err)
	}
	truncated := int64(len(body)) > p.cfg.MaxPageBytes
	if truncated {
		body = body[:p.cfg.MaxPageBytes]
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	var title, text string
	switch {
	case mt == "text/html" || mt == "application/xhtml+xml" || (mt == "" && strings.Contains(strings.ToLower(string(body[:min(len(body), 512)])), "<html")):
		title, text, err = HTMLText(strings.NewReader(string(body)))
		if err != nil {
			return Page{}, fmt.Errorf("parse html: %w", err)
		}
	case strings.HasPrefix(mt, "text/"):
		text = string(body)
	default:
		return Page{}, fmt.Errorf("unsupported content type %q", mt)
	}
	text, cut := clipTrunc(text, p.cfg.MaxChars)
	return Page{URL: resp.Request.URL.String(), Title: title, Text: text, Truncated: truncated || cut}, nil
}

// skipped elements contribute no text.
var skipped = map[atom.Atom]bool{atom.Script: true, atom.Style: true, atom.Noscript: true, atom.Template: true,
	atom.Svg: true, atom.Iframe: true, atom.Head: true}

// blocks end a line of text.
var blocks = map[atom.Atom]bool{atom.P: true, atom.Div: true, atom.Br: true, atom.Li: true, atom.Tr: true,
	atom.H1: true, atom.H2: true, atom.H3: true, atom.H4: true, atom.H5: true, atom.H6: true, atom.Section: true,
	atom.Article: true, atom.Pre: true, atom.Blockquote: true, atom.Table: true, atom.Ul: true, atom.Ol: true, atom.Hr: true}

// HTMLText returns an HTML document's title and visible text: scripts,
// styles and the head are dropped, whitespace is collapsed, block elements
// end lines.
func HTMLText(r io.Reader) (title, text string, err error) {
	doc, err := html.Parse(r)
	if err != nil {
		return "", "", err
	}
	var b strings.Builder
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			if n.DataAtom == atom.Title && title == "" && n.FirstChild != nil {
				title = strings.Join(strings.Fields(n.FirstChild.Data), " ")
			}
			if skipped[n.DataAtom] {
				return
			}
		}
		if n.Type == html.TextNode {
			if f := strings.Fields(n.Data); len(f) > 0 {
				if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
					b.WriteByte(' ')
				}
				b.WriteString(strings.Join(f, " "))
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
		if n.Type == html.ElementNode && blocks[n.DataAtom] && b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
	}
	walk(doc)
	// The title lives in <head>, skipped above: find it separately.
	if title == "" {
		var find func(n *html.Node)
		find = func(n *html.Node) {
			if title != "" {
				return
			}
			if n.Type == html.ElementNode && n.DataAtom == atom.Title && n.FirstChild != nil {
				title = strings.Join(strings.Fields(n.FirstChild.Data), " ")
				return
			}
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				find(c)
			}
		}
		find(doc)
	}
	return title, strings.TrimSpace(b.String()), nil
}
