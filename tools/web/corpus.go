package web

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"unicode"
)

// Doc is one corpus document.
type Doc struct {
	URL   string `json:"url"`
	Title string `json:"title"`
	Text  string `json:"text"`
}

// ReadCorpus reads a JSONL corpus file.
func ReadCorpus(path string) ([]Doc, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	defer f.Close()
	return ParseCorpus(f, path)
}

// ParseCorpus reads JSONL documents {url, title, text}; name is for errors.
func ParseCorpus(r io.Reader, name string) ([]Doc, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var docs []Doc
	line := 0
	for sc.Scan() {
		line++
		b := strings.TrimSpace(sc.Text())
		if b == "" {
			continue
		}
		var d Doc
		dec := json.NewDecoder(strings.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&d); err != nil {
			return nil, fmt.Errorf("corpus %s line %d: %w", name, line, err)
		}
		if d.URL == "" || d.Text == "" {
			return nil, fmt.Errorf("corpus %s line %d: url and text are required", name, line)
		}
		docs = append(docs, d)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("corpus %s: %w", name, err)
	}
	return docs, nil
}

// Corpus is the local-corpus provider: search ranks documents by how many
// distinct query terms their title and text contain (title matches count
// double), extract returns a document by exact URL.
type Corpus struct {
	docs     []Doc
	terms    []map[string]int // per doc: term → weight
	byURL    map[string]int
	maxChars int
}

// NewCorpus indexes docs.
func NewCorpus(docs []Doc, c Config) (*Corpus, error) {
	c.defaults()
	if len(docs) == 0 {
		return nil, fmt.Errorf("%w: the corpus is empty", ErrConfig)
	}
	k := &Corpus{docs: docs, byURL: map[string]int{}, maxChars: c.MaxChars}
	for i, d := range docs {
		if _, dup := k.byURL[d.URL]; dup {
			return nil, fmt.Errorf("%w: corpus: duplicate url %s", ErrConfig, d.URL)
		}
		k.byURL[d.URL] = i
		m := map[string]int{}
		for _, t := range terms(d.Text) {
			m[t] = max(m[t], 1)
		}
		for _, t := range terms(d.Title) {
			m[t] = 2
		}
		k.terms = append(k.terms, m)
	}
	return k, nil
}

func terms(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
}

// Search implements Provider.
func (k *Corpus) Search(ctx context.Context, query string, n int) ([]Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := map[string]bool{}
	for _, t := range terms(query) {
		if len(t) > 1 {
			q[t] = true
		}
	}
	type hit struct{ i, score int }
	var hits []hit
	for i, m := range k.terms {
		s := 0
		for t := range q {
			s += m[t]
		}
		if s > 0 {
			hits = append(hits, hit{i, s})
		}
	}
	sort.SliceStable(hits, func(a, b int) bool { return hits[a].score > hits[b].score })
	var out []Result
	for _, h := range hits {
		if len(out) == n {
			break
		}
		d := k.docs[h.i]
		out = append(out, Result{Title: d.Title, URL: d.URL, Snippet: clip(d.Text, 200)})
	}
	return out, nil
}

// Extract implements Provider.
func (k *Corpus) Extract(ctx context.Context, url string) (Page, error) {
	if err := ctx.Err(); err != nil {
		return Page{}, err
	}
	i, ok := k.byURL[url]
	if !ok {
		return Page{}, fmt.Errorf("%s: not found", url)
	}
	d := k.docs[i]
	text, cut := clipTrunc(d.Text, k.maxChars)
	return Page{URL: d.URL, Title: d.Title, Text: text, Truncated: cut}, nil
}

func clip(s string, n int) string {
	t, _ := clipTrunc(s, n)
	return t
}

// clipTrunc cuts s to at most n runes.
func clipTrunc(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	r := []rune(s)
	if len(r) <= n {
		return s, false
	}
	return string(r[:n]), true
}
