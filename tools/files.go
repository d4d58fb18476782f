package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/sandbox"
)

const (
	readDefaultLimit = 500
	readMaxLimit     = 2000
	readMaxLineChars = 2000
	readMaxChars     = 100_000
)

const readFileSchema = `{
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "File path: absolute, relative to the current directory, or starting with ~."},
    "offset": {"type": "integer", "minimum": 1, "default": 1, "description": "First line to read (1-based)."},
    "limit": {"type": "integer", "minimum": 1, "default": 500, "description": "Number of lines to read (max 2000)."}
  },
  "required": ["path"]
}`

const writeFileSchema = `{
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "File path to write; parent directories are created."},
    "content": {"type": "string", "description": "The complete new content of the file."}
  },
  "required": ["path", "content"]
}`

const patchSchema = `{
  "type": "object",
  "properties": {
    "mode": {"type": "string", "enum": ["replace", "patch"], "default": "replace", "description": "replace: exact string replacement in one file; patch: a V4A multi-file patch."},
    "path": {"type": "string", "description": "File to edit (replace mode)."},
    "old_string": {"type": "string", "description": "Exact text to find (replace mode). Must match exactly once unless replace_all is true."},
    "new_string": {"type": "string", "description": "Replacement text (replace mode)."},
    "replace_all": {"type": "boolean", "default": false, "description": "Replace every occurrence (replace mode)."},
    "patch": {"type": "string", "description": "V4A patch text (patch mode): *** Begin Patch / *** Update File: p / @@ / context, -old, +new lines / *** End Patch."}
  },
  "required": ["mode"]
}`

func pathArg(a Args) []string {
	if p := a.String("path", ""); p != "" {
		return []string{p}
	}
	return nil
}

func readFileTool() Tool {
	return Tool{Name: "read_file", Toolset: ToolsetFile, Parameters: []byte(readFileSchema), Class: ReadOnly, Paths: pathArg, MaxResultChars: -1,
		Description: "Read a text file with line numbers (format: '     N|line'). Use offset and limit to page through large files.",
		Handler:     runReadFile}
}

func writeFileTool() Tool {
	return Tool{Name: "write_file", Toolset: ToolsetFile, Parameters: []byte(writeFileSchema), Class: PathScoped, Paths: pathArg, MaxResultChars: 100_000,
		Description: "Write a file, replacing its content completely. Creates parent directories. Use patch for small edits.",
		Handler:     runWriteFile}
}

func patchTool() Tool {
	return Tool{Name: "patch", Toolset: ToolsetFile, Parameters: []byte(patchSchema), Class: PathScoped, Paths: patchPaths, MaxResultChars: 100_000,
		Description: "Edit a file by exact string replacement (mode=replace with path, old_string, new_string, optional replace_all) or apply a V4A patch (mode=patch). Returns a unified diff.",
		Handler:     runPatch}
}

// stat returns size, mode and kind of p; exists=false when it is missing.
func stat(ctx context.Context, rt *Runtime, p string) (size int64, mode fs.FileMode, kind string, exists bool, err error) {
	res, err := rt.argv(ctx, 30*time.Second, "stat", "-L", "-c", "%s %a %F", "--", p)
	if err != nil {
		return 0, 0, "", false, err
	}
	if res.ExitCode != 0 {
		msg := string(res.Stderr) + string(res.Stdout)
		if strings.Contains(msg, "No such file") || strings.Contains(msg, "can't stat") || strings.Contains(msg, "cannot stat") || strings.Contains(msg, "Not a directory") {
			return 0, 0, "", false, nil
		}
		return 0, 0, "", false, fmt.Errorf("stat %s: exit %d: %s", p, res.ExitCode, strings.TrimSpace(msg))
	}
	f := strings.SplitN(strings.TrimSpace(string(res.Stdout)), " ", 3)
	if len(f) < 3 {
		return 0, 0, "", false, fmt.Errorf("stat %s: unexpected output %q", p, res.Stdout)
	}
	size, _ = strconv.ParseInt(f[0], 10, 64)
	m, _ := strconv.ParseUint(f[1], 8, 32)
	return size, fs.FileMode(m), f[2], true, nil
}

var imageExt = map[string]bool{".png": true, ".jpg": true, ".jpeg": true, ".gif": true, ".bmp": true, ".webp": true, ".ico": true, ".tiff": true, ".svgz": true}

var binaryExt = map[string]bool{".zip": true, ".tar": true, ".gz": true, ".tgz": true, ".bz2": true, ".xz": true, ".zst": true, ".7z": true, ".rar": true,
	".so": true, ".o": true, ".a": true, ".dylib": true, ".exe": true, ".dll": true, ".bin": true, ".class": true, ".jar": true, ".pyc": true, ".pyo": true,
	".pdf": true, ".db": true, ".sqlite": true, ".sqlite3": true, ".parquet": true, ".wasm": true, ".mp3": true, ".mp4": true, ".wav": true, ".avi": true,
	".mov": true, ".ttf": true, ".otf": true, ".woff": true, ".woff2": true, ".npy": true, ".pkl": true, ".pt": true, ".safetensors": true}

// looksBinary: a NUL byte or more than 30 % control characters in the
// first 1000 bytes.
func looksBinary(b []byte) bool {
	if len(b) > 1000 {
		b = b[:1000]
	}
	if len(b) == 0 {
		return false
	}
	ctrl := 0
	for _, c := range b {
		if c == 0 {
			return true
		}
		if c < 32 && c != '\n' && c != '\r' && c != '\t' && c != '\f' && c != '\b' {
			ctrl++
		}
	}
	return ctrl*10 > len(b)*3
}

func infraOr(ctx context.Context, err error) bool { return IsInfra(err) || ctx.Err() != nil }

func readError(p, msg string, extra map[string]any) string {
	r := map[string]any{"content": "", "total_lines": 0, "file_size": 0, "truncated": false, "is_binary": false, "is_image": false, "error": msg, "path": p}
	for k, v := range extra {
		r[k] = v
	}
	return marshal(r)
}

func runReadFile(ctx context.Context, rt *Runtime, a Args) (string, error) {
	raw := a.String("path", "")
	p, err := rt.Resolve(ctx, raw)
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return readError(raw, "Invalid path: "+err.Error(), nil), nil
	}
	if strings.HasPrefix(p, "/dev/") || p == "/dev" || strings.HasPrefix(p, "/proc/") && strings.Contains(p, "/fd/") {
		return readError(p, "Refusing to read device path "+p, nil), nil
	}
	size, _, kind, exists, err := stat(ctx, rt, p)
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		// No usable stat in the image: rely on ReadFile's own errors.
		exists, kind = true, "regular file"
	}
	if !exists {
		return readError(p, "File not found: "+p, map[string]any{"similar_files": similarFiles(ctx, rt, p)}), nil
	}
	if kind == "directory" {
		return readError(p, p+" is a directory; use search_files with target=files to list it", nil), nil
	}
	ext := strings.ToLower(path.Ext(p))
	if imageExt[ext] {
		return readError(p, "This is an image file; read_file only reads text.", map[string]any{"is_image": true, "is_binary": true, "file_size": size}), nil
	}
	if binaryExt[ext] {
		return readError(p, "Cannot read binary file "+p+" ("+ext+"); use terminal tools to inspect it.", map[string]any{"is_binary": true, "file_size": size}), nil
	}
	if size > maxReadFileBytes {
		return readError(p, fmt.Sprintf("File is too large to read (%d bytes, limit %d); use terminal tools such as head, tail or sed -n to look at parts of it.", size, maxReadFileBytes), map[string]any{"file_size": size}), nil
	}
	data, err := rt.Sandbox.ReadFile(ctx, p)
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		if errors.Is(err, sandbox.ErrNotFound) {
			return readError(p, "File not found: "+p, map[string]any{"similar_files": similarFiles(ctx, rt, p)}), nil
		}
		return readError(p, "Could not read file: "+err.Error(), nil), nil
	}
	if looksBinary(data) {
		return readError(p, "Cannot read binary file "+p+"; use terminal tools to inspect it.", map[string]any{"is_binary": true, "file_size": len(data)}), nil
	}
	text := strings.ToValidUTF8(string(data), "\uFFFD")
	lines := strings.SplitAfter(text, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	total := len(lines)
	offset := a.Int("offset", 1)
	limit := a.Int("limit", readDefaultLimit)
	if limit > readMaxLimit {
		limit = readMaxLimit
	}
	if offset < 1 {
		offset = 1
	}
	if total > 0 && offset > total {
		return readError(p, fmt.Sprintf("offset %d is past the end of the file (%d lines)", offset, total), map[string]any{"total_lines": total, "file_size": len(data)}), nil
	}
	end := min(total, offset-1+limit)
	var b strings.Builder
	for i := offset - 1; i < end; i++ {
		line := strings.TrimRight(lines[i], "\r\n")
		if utf8.RuneCountInString(line) > readMaxLineChars {
			line = HeadRunes(line, readMaxLineChars) + "... [truncated]"
		}
		fmt.Fprintf(&b, "%6d|%s\n", i+1, line)
	}
	content := strings.TrimSuffix(b.String(), "\n")
	if n := utf8.RuneCountInString(content); n > readMaxChars {
		return marshal(map[string]any{"error": fmt.Sprintf("Read produced %d characters which exceeds the safety limit (100,000 chars). Use a smaller limit (or offset) to read a section of the file.", n),
			"path": p, "total_lines": total, "file_size": len(data)}), nil
	}
	r := map[string]any{"content": content, "total_lines": total, "file_size": len(data), "truncated": end < total, "is_binary": false, "is_image": false}
	if end < total {
		r["hint"] = fmt.Sprintf("Use offset=%d to continue reading (showing %d-%d of %d lines)", end+1, offset, end, total)
	}
	return marshal(r), nil
}

// similarFiles suggests up to five siblings whose names resemble p's.
func similarFiles(ctx context.Context, rt *Runtime, p string) []string {
	dir, base := path.Split(p)
	res, err := rt.argv(ctx, 15*time.Second, "ls", "-1A", "--", dir)
	if err != nil || res.ExitCode != 0 {
		return []string{}
	}
	want := strings.ToLower(strings.TrimSuffix(base, path.Ext(base)))
	type cand struct {
		name  string
		score int
	}
	var cs []cand
	for _, n := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if n == "" {
			continue
		}
		ln := strings.ToLower(n)
		stem := strings.TrimSuffix(ln, path.Ext(ln))
		s := 0
		switch {
		case stem == want:
			s = 100
		case strings.Contains(ln, want) || strings.Contains(want, stem) && stem != "":
			s = 60
		default:
			if d := levenshtein(stem, want); d <= max(1, len(want)/3) {
				s = 50 - d
			} else {
				s = commonPrefix(ln, want) * 10
			}
		}
		if s >= 20 {
			cs = append(cs, cand{dir + n, s})
		}
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].score > cs[j].score })
	out := []string{}
	for i := 0; i < len(cs) && i < 5; i++ {
		out = append(out, cs[i].name)
	}
	return out
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func protectedPath(p string) bool {
	for _, pre := range []string{"/dev", "/proc", "/sys"} {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

// writeKeepingMode writes through the sandbox file API, creating parents
// (argv mkdir, never a shell) and keeping an existing file's mode.
func writeKeepingMode(ctx context.Context, rt *Runtime, p string, data []byte) (dirsCreated bool, err error) {
	mode := fs.FileMode(0o644)
	_, m, kind, exists, err := stat(ctx, rt, p)
	if err != nil {
		return false, err
	}
	if exists {
		if kind == "directory" {
			return false, fmt.Errorf("%s is a directory", p)
		}
		mode = m.Perm()
	} else {
		_, _, pkind, pexists, err := stat(ctx, rt, path.Dir(p))
		if err != nil {
			return false, err
		}
		if pexists && pkind != "directory" {
			return false, fmt.Errorf("parent %s is not a directory", path.Dir(p))
		}
		if !pexists {
			res, err := rt.argv(ctx, 30*time.Second, "mkdir", "-p", "--", path.Dir(p))
			if err != nil {
				return false, err
			}
			if res.ExitCode != 0 {
				return false, fmt.Errorf("create directory %s: %s", path.Dir(p), strings.TrimSpace(string(res.Stderr)))
			}
			dirsCreated = true
		}
	}
	return dirsCreated, rt.Sandbox.WriteFile(ctx, p, data, mode)
}

func runWriteFile(ctx context.Context, rt *Runtime, a Args) (string, error) {
	raw := a.String("path", "")
	content, ok := a["content"].(string)
	if !ok {
		return ErrorResult("write_file needs content as a string"), nil
	}
	p, err := rt.Resolve(ctx, raw)
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return ErrorResult("Invalid path: " + err.Error()), nil
	}
	if protectedPath(p) {
		return ErrorResult("Refusing to write to protected path " + p), nil
	}
	created, err := writeKeepingMode(ctx, rt, p, []byte(content))
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return ErrorResult(fmt.Sprintf("Failed to write %s: %v", p, err)), nil
	}
	return marshal(map[string]any{"bytes_written": len(content), "dirs_created": created, "lint": lint(p, content)}), nil
}

// lint checks formats Go can check without tools in the image; anything
// else is reported as skipped, never as ok.
func lint(p, content string) map[string]any {
	switch strings.ToLower(path.Ext(p)) {
	case ".json":
		var v any
		if err := json.Unmarshal([]byte(content), &v); err != nil {
			return map[string]any{"status": "error", "output": "invalid JSON: " + err.Error()}
		}
		return map[string]any{"status": "ok", "output": ""}
	case ".yaml", ".yml":
		var v any
		if err := yaml.Unmarshal([]byte(content), &v); err != nil {
			return map[string]any{"status": "error", "output": "invalid YAML: " + err.Error()}
		}
		return map[string]any{"status": "ok", "output": ""}
	}
	return map[string]any{"status": "skipped", "output": "", "message": "no linter for this file type"}
}

func patchFail(msg string, hint string) string {
	r := map[string]any{"success": false, "error": msg}
	if hint != "" {
		r["_hint"] = hint
	}
	return marshal(r)
}

func runPatch(ctx context.Context, rt *Runtime, a Args) (string, error) {
	if a.String("mode", "replace") == "patch" {
		return runV4APatch(ctx, rt, a.String("patch", ""))
	}
	raw := a.String("path", "")
	if raw == "" {
		return patchFail("replace mode needs path, old_string and new_string", ""), nil
	}
	oldS, okOld := a["old_string"].(string)
	newS, okNew := a["new_string"].(string)
	if !okOld || !okNew {
		return patchFail("replace mode needs old_string and new_string", ""), nil
	}
	if oldS == "" {
		return patchFail("old_string is empty; to create or overwrite a file use write_file", ""), nil
	}
	p, err := rt.Resolve(ctx, raw)
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return patchFail("Invalid path: "+err.Error(), ""), nil
	}
	data, err := rt.Sandbox.ReadFile(ctx, p)
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		if errors.Is(err, sandbox.ErrNotFound) {
			return patchFail("File not found: "+p, "Check the path with search_files (target=files), or use write_file to create a new file."), nil
		}
		return patchFail(fmt.Sprintf("Could not read %s: %v", p, err), ""), nil
	}
	before := string(data)
	after, n, failMsg, hint := replaceExact(before, oldS, newS, a.Bool("replace_all", false))
	if failMsg != "" {
		return patchFail(strings.ReplaceAll(failMsg, "{path}", p), hint), nil
	}
	if _, err := writeKeepingMode(ctx, rt, p, []byte(after)); err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return patchFail(fmt.Sprintf("Failed to write %s: %v", p, err), ""), nil
	}
	check, err := rt.Sandbox.ReadFile(ctx, p)
	if err != nil {
		if infraOr(ctx, err) {
			return "", err
		}
		return patchFail(fmt.Sprintf("Could not verify %s after writing: %v", p, err), ""), nil
	}
	if string(check) != after {
		return patchFail(fmt.Sprintf("Verification failed: %s does not contain the intended content after writing", p), ""), nil
	}
	r := map[string]any{"success": true, "diff": UnifiedDiff(p, before, after), "files_modified": []string{p}, "replacements": n}
	if l := lint(p, after); l["status"] != "skipped" {
		r["lint"] = l
	}
	return marshal(r), nil
}

// replaceExact does the replace-mode edit. A miss retries with CRLF
// normalised, the common cause when the model writes \n into a CRLF file.
func replaceExact(content, oldS, newS string, all bool) (out string, n int, fail, hint string) {
	n = strings.Count(content, oldS)
	if n == 0 && strings.Contains(content, "\r\n") && !strings.Contains(oldS, "\r\n") {
		o2 := strings.ReplaceAll(oldS, "\n", "\r\n")
		if c := strings.Count(content, o2); c > 0 {
			oldS, newS, n = o2, strings.ReplaceAll(newS, "\n", "\r\n"), c
		}
	}
	switch {
	case n == 0:
		return "", 0, "old_string not found in {path}", "old_string not found. Use read_file to see the exact current text (including whitespace and indentation) and retry."
	case n > 1 && !all:
		return "", n, fmt.Sprintf("old_string matches %d times in {path}; include more surrounding context to make it unique, or set replace_all=true", n), ""
	}
	if all {
		return strings.ReplaceAll(content, oldS, newS), n, "", ""
	}
	return strings.Replace(content, oldS, newS, 1), 1, "", ""
}

func levenshtein(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
