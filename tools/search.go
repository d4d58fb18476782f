package tools

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

const searchSchema = `{
  "type": "object",
  "properties": {
    "pattern": {"type": "string", "description": "Regular expression for target=content; glob (e.g. *.py) for target=files."},
    "target": {"type": "string", "enum": ["content", "files", "grep", "find"], "default": "content", "description": "content: search inside files; files: find files by name."},
    "path": {"type": "string", "default": ".", "description": "Directory or file to search (default: current directory)."},
    "file_glob": {"type": "string", "description": "Only search files whose name matches this glob (content search)."},
    "limit": {"type": "integer", "minimum": 1, "default": 50, "description": "Maximum results to return."},
    "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "Results to skip (pagination)."},
    "output_mode": {"type": "string", "enum": ["content", "files_only", "count"], "default": "content", "description": "content: matching lines; files_only: file paths; count: matches per file."},
    "context": {"type": "integer", "minimum": 0, "default": 0, "description": "Lines of context around each match."}
  },
  "required": ["pattern"]
}`

func searchTool() Tool {
	return Tool{Name: "search_files", Toolset: ToolsetFile, Parameters: []byte(searchSchema), Class: ReadOnly, MaxResultChars: 100_000,
		Paths:       func(a Args) []string { return []string{a.String("path", ".")} },
		Description: "Search file contents with a regular expression (target=content) or find files by glob (target=files). Hidden files are skipped. Results are paginated with offset and limit.",
		Handler:     runSearch}
}

type match struct {
	Path    string `json:"path"`
	Line    int    `json:"line"`
	Content string `json:"content"`
}

// hasRipgrep probes the sandbox once per rollout.
func (rt *Runtime) hasRipgrep(ctx context.Context) (bool, error) {
	rt.mu.Lock()
	v := rt.hasRG
	rt.mu.Unlock()
	if v != 0 {
		return v == 1, nil
	}
	res, err := rt.argv(ctx, 15*time.Second, "rg", "--version")
	if err != nil && (IsInfra(err) || ctx.Err() != nil) {
		return false, err
	}
	ok := err == nil && res.ExitCode == 0
	rt.mu.Lock()
	rt.hasRG = 2
	if ok {
		rt.hasRG = 1
	}
	rt.mu.Unlock()
	return ok, nil
}

func hiddenPath(rel string) bool {
	for _, part := range strings.Split(rel, "/") {
		if len(part) > 1 && part[0] == '.' && part != ".." {
			return true
		}
	}
	return false
}

func globMatch(glob, p string) bool {
	if glob == "" {
		return true
	}
	if strings.Contains(glob, "/") {
		ok, _ := path.Match(glob, p)
		if ok {
			return true
		}
		ok, _ = path.Match(glob, strings.TrimPrefix(p, "./"))
		return ok
	}
	ok, _ := path.Match(glob, path.Base(p))
	return ok
}

func runSearch(ctx context.Context, rt *Runtime, a Args) (string, error) {
	pattern := a.String("pattern", "")
	target := a.String("target", "content")
	switch target {
	case "grep":
		target = "content"
	case "find":
		target = "files"
	}
	limit, offset := a.Int("limit", 50), a.Int("offset", 0)
	root, err := rt.Resolve(ctx, a.String("path", "."))
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return ErrorResult("Invalid path: " + err.Error()), nil
	}
	_, _, _, exists, err := stat(ctx, rt, root)
	if err != nil && infraOr(ctx, err) {
		return "", err
	}
	if err == nil && !exists {
		return marshal(map[string]any{"total_count": 0, "error": "Path not found: " + root, "similar_paths": similarFiles(ctx, rt, root)}), nil
	}
	rg, err := rt.hasRipgrep(ctx)
	if err != nil {
		return "", err
	}
	if target == "files" {
		return searchFiles(ctx, rt, rg, root, pattern, limit, offset)
	}
	if _, rerr := regexp.Compile(pattern); rerr != nil && !rg {
		return ErrorResult(fmt.Sprintf("Invalid regular expression %q: %v", pattern, rerr)), nil
	}
	ms, truncatedOut, errMsg, err := searchContent(ctx, rt, rg, root, pattern, a.String("file_glob", ""), a.Int("context", 0))
	if err != nil {
		return "", err
	}
	if errMsg != "" {
		return marshal(map[string]any{"total_count": 0, "error": errMsg}), nil
	}
	r := map[string]any{}
	switch a.String("output_mode", "content") {
	case "files_only":
		var files []string
		seen := map[string]bool{}
		for _, m := range ms {
			if !seen[m.Path] {
				seen[m.Path] = true
				files = append(files, m.Path)
			}
		}
		page, more := paginate(files, offset, limit)
		r["total_count"], r["files"] = len(files), page
		if more {
			r["truncated"] = true
			r["hint"] = fmt.Sprintf("Results truncated. Use offset=%d to see more.", offset+len(page))
		}
	case "count":
		counts := map[string]int{}
		for _, m := range ms {
			counts[m.Path]++
		}
		r["total_count"], r["counts"] = len(ms), counts
	default:
		page, more := paginate(ms, offset, limit)
		r["total_count"], r["matches"] = len(ms), page
		if more {
			r["truncated"] = true
			r["hint"] = fmt.Sprintf("Results truncated. Use offset=%d to see more.", offset+len(page))
		}
	}
	if truncatedOut {
		r["truncated"] = true
		r["_warning"] = "The search produced too much output; counts are incomplete. Narrow the pattern, path or file_glob."
	}
	return marshal(r), nil
}

func paginate[T any](xs []T, offset, limit int) ([]T, bool) {
	if offset > len(xs) {
		offset = len(xs)
	}
	end := min(len(xs), offset+limit)
	page := xs[offset:end]
	if page == nil {
		page = []T{}
	}
	return page, end < len(xs)
}

const searchOutputCap = 16 << 20

var grepLineRE = regexp.MustCompile(`^(.*?)[:-](\d+)[:-](.*)$`)

func searchContent(ctx context.Context, rt *Runtime, rg bool, root, pattern, glob string, contextN int) (ms []match, truncated bool, errMsg string, err error) {
	var argv []string
	if rg {
		argv = []string{"rg", "--json", "--no-config", "--color", "never"}
		if contextN > 0 {
			argv = append(argv, "-C", strconv.Itoa(contextN))
		}
		if glob != "" {
			argv = append(argv, "--glob", glob)
		}
		argv = append(argv, "-e", pattern, "--", root)
	} else {
		argv = []string{"grep", "-rnHE"}
		if contextN > 0 {
			argv = append(argv, "-C", strconv.Itoa(contextN))
		}
		argv = append(argv, "-e", pattern, "--", root)
	}
	res, err := rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: argv, Timeout: 120 * time.Second, OutputCap: searchOutputCap})
	if err != nil {
		if infraOr(ctx, err) {
			return nil, false, "", err
		}
		return nil, false, "Search failed: " + err.Error(), nil
	}
	if res.TimedOut {
		return nil, false, "Search timed out after 120s; narrow the path or pattern.", nil
	}
	if res.ExitCode > 1 && len(res.Stdout) == 0 {
		return nil, false, fmt.Sprintf("Search failed (exit %d): %s", res.ExitCode, strings.TrimSpace(string(res.Stderr))), nil
	}
	sc := bufio.NewScanner(bytes.NewReader(res.Stdout))
	sc.Buffer(make([]byte, 64<<10), searchOutputCap)
	for sc.Scan() {
		line := sc.Bytes()
		var m match
		if rg {
			var ev struct {
				Type string `json:"type"`
				Data struct {
					Path struct {
						Text string `json:"text"`
					} `json:"path"`
					Lines struct {
						Text string `json:"text"`
					} `json:"lines"`
					LineNumber int `json:"line_number"`
				} `json:"data"`
			}
			if json.Unmarshal(line, &ev) != nil || (ev.Type != "match" && ev.Type != "context") {
				continue
			}
			m = match{Path: ev.Data.Path.Text, Line: ev.Data.LineNumber, Content: ev.Data.Lines.Text}
		} else {
			g := grepLineRE.FindSubmatch(line)
			if g == nil {
				continue
			}
			n, _ := strconv.Atoi(string(g[2]))
			m = match{Path: string(g[1]), Line: n, Content: string(g[3])}
			rel := strings.TrimPrefix(strings.TrimPrefix(m.Path, root), "/")
			if hiddenPath(rel) || !globMatch(glob, m.Path) {
				continue
			}
		}
		m.Content = strings.TrimRight(strings.ToValidUTF8(m.Content, "\uFFFD"), "\r\n")
		if len(m.Content) > readMaxLineChars {
			m.Content = HeadRunes(m.Content, readMaxLineChars) + "... [truncated]"
		}
		ms = append(ms, m)
	}
	return ms, res.StdoutTruncated, "", nil
}

func searchFiles(ctx context.Context, rt *Runtime, rg bool, root, glob string, limit, offset int) (string, error) {
	var argv []string
	if rg {
		argv = []string{"rg", "--files", "--no-config", "--sortr=modified"}
		if glob != "" {
			argv = append(argv, "--glob", glob)
		}
		argv = append(argv, "--", root)
	} else {
		argv = []string{"find", root, "-type", "f"}
	}
	res, err := rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: argv, Timeout: 120 * time.Second, OutputCap: searchOutputCap})
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return marshal(map[string]any{"total_count": 0, "error": "File search failed: " + err.Error()}), nil
	}
	if res.ExitCode > 1 && len(res.Stdout) == 0 {
		return marshal(map[string]any{"total_count": 0, "error": fmt.Sprintf("File search failed (exit %d): %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))}), nil
	}
	var files []string
	for _, f := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if f == "" {
			continue
		}
		if !rg {
			rel := strings.TrimPrefix(strings.TrimPrefix(f, root), "/")
			if hiddenPath(rel) || !globMatch(glob, f) {
				continue
			}
		}
		files = append(files, f)
	}
	if !rg {
		sort.Strings(files)
	}
	page, more := paginate(files, offset, limit)
	r := map[string]any{"total_count": len(files), "files": page}
	if more {
		r["truncated"] = true
		r["hint"] = fmt.Sprintf("Results truncated. Use offset=%d to see more.", offset+len(page))
	}
	if res.StdoutTruncated {
		r["truncated"] = true
		r["_warning"] = "Too many files; the list is incomplete. Narrow the path or pattern."
	}
	return marshal(r), nil
}
