package envs

import (
	"archive/tar"
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/datasets"
)

//go:embed data
var dataFS embed.FS

// DefaultSystemPrompt is the system message of the built-in agentic envs.
const DefaultSystemPrompt = "You are a helpful assistant with access to a Linux sandbox through terminal and file tools. " +
	"Use the tools to complete the task, check your work, then reply with a short summary."

// embeddedItems reads one of the env datasets shipped in the binary and
// keeps the rows of split ("" keeps all; rows without a split field are
// in "train").
func embeddedItems(name, split string) ([]datasets.Item, error) {
	f, err := dataFS.Open("data/" + name)
	if err != nil {
		return nil, fmt.Errorf("embedded dataset %s: %w", name, err)
	}
	defer f.Close()
	rows, err := datasets.ReadJSONL(f, name)
	if err != nil {
		return nil, err
	}
	var out []datasets.Item
	for _, it := range rows {
		s, _ := it.Data["split"].(string)
		if s == "" {
			s = "train"
		}
		if split == "" || split == s {
			out = append(out, it)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: embedded dataset %s has no split %q", datasets.ErrInvalid, name, split)
	}
	return datasets.Prepare(out, datasets.Config{})
}

// chat builds [system, user] messages.
func chat(system, user string) []openai.ChatCompletionMessage {
	var m []openai.ChatCompletionMessage
	if system != "" {
		m = append(m, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleSystem, Content: system})
	}
	return append(m, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: user})
}

// decodeItem converts an item's data into a typed row, naming the item in
// errors.
func decodeItem(it datasets.Item, out any) error {
	b, err := json.Marshal(it.Data)
	if err != nil {
		return fmt.Errorf("%w: %s row %d: %v", datasets.ErrInvalid, it.Source, it.Row, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%w: %s row %d: %v", datasets.ErrInvalid, it.Source, it.Row, err)
	}
	return nil
}

// solution returns the item's "solution" field as raw JSON.
func solution(it datasets.Item) (json.RawMessage, bool) {
	v, ok := it.Data["solution"]
	if !ok {
		return nil, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return b, true
}

// tarOf builds an uncompressed tar of files (relative paths, sorted, with
// their parent directories) for Sandbox.Upload; every file gets mode.
func tarOf(files map[string]string, mode fs.FileMode) ([]byte, error) {
	return packTar(files, func(string) fs.FileMode { return mode })
}

// packTar is tarOf with a mode per file.
func packTar(files map[string]string, modeOf func(name string) fs.FileMode) ([]byte, error) {
	names := make([]string, 0, len(files))
	dirSet := map[string]bool{}
	for n := range files {
		if strings.HasPrefix(n, "/") || strings.Contains(n, "..") {
			return nil, fmt.Errorf("tar entry %q: must be a relative path without '..'", n)
		}
		names = append(names, n)
		for d := parentDir(n); d != "" && !dirSet[d]; d = parentDir(d) {
			dirSet[d] = true
		}
	}
	dirs := make([]string, 0, len(dirSet))
	for d := range dirSet {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs) // parents sort before their children
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, n := range names {
		body := files[n]
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: int64(modeOf(n)), Size: int64(len(body)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func parentDir(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return ""
	}
	return p[:i]
}

// finalText is the content of the last assistant message.
func finalText(msgs []openai.ChatCompletionMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == openai.ChatMessageRoleAssistant {
			return msgs[i].Content
		}
	}
	return ""
}
