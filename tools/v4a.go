package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rollout-rl/rollout/sandbox"
)

// V4A patch format (the one Hermes' patch tool accepts in mode=patch):
//
//	*** Begin Patch
//	*** Update File: path
//	@@ optional line to search for first
//	 context
//	-removed
//	+added
//	*** Add File: path
//	+content line
//	*** Delete File: path
//	*** End Patch

type v4aChunk struct {
	hint     string
	old, new []string
}

type v4aOp struct {
	kind   string // update, add, delete
	path   string
	chunks []v4aChunk
	added  []string
}

func parseV4A(text string) ([]v4aOp, error) {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	i := 0
	for i < len(lines) && strings.TrimSpace(lines[i]) == "" {
		i++
	}
	if i >= len(lines) || strings.TrimSpace(lines[i]) != "*** Begin Patch" {
		return nil, errors.New("patch must start with '*** Begin Patch'")
	}
	i++
	var ops []v4aOp
	var cur *v4aOp
	var chunk *v4aChunk
	flushChunk := func() {
		if cur != nil && chunk != nil && (len(chunk.old) > 0 || len(chunk.new) > 0) {
			cur.chunks = append(cur.chunks, *chunk)
		}
		chunk = nil
	}
	ended := false
	for ; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.TrimSpace(l) == "*** End Patch":
			ended = true
		case strings.HasPrefix(l, "*** Update File: "), strings.HasPrefix(l, "*** Add File: "), strings.HasPrefix(l, "*** Delete File: "):
			flushChunk()
			kind, p, _ := strings.Cut(strings.TrimPrefix(l, "*** "), " File: ")
			ops = append(ops, v4aOp{kind: strings.ToLower(kind), path: strings.TrimSpace(p)})
			cur = &ops[len(ops)-1]
		case strings.HasPrefix(l, "*** Move to: "):
			return nil, errors.New("'*** Move to' is not supported; write the new file and delete the old one")
		case cur == nil:
			if strings.TrimSpace(l) != "" {
				return nil, fmt.Errorf("line %d: expected a '*** Update/Add/Delete File:' header, got %q", i+1, l)
			}
		case cur.kind == "add":
			if strings.HasPrefix(l, "+") {
				cur.added = append(cur.added, l[1:])
			} else if l != "" {
				return nil, fmt.Errorf("line %d: lines of an added file must start with '+'", i+1)
			}
		case cur.kind == "delete":
			if strings.TrimSpace(l) != "" {
				return nil, fmt.Errorf("line %d: unexpected content after '*** Delete File'", i+1)
			}
		case strings.HasPrefix(l, "@@"):
			flushChunk()
			chunk = &v4aChunk{hint: strings.TrimSpace(strings.Trim(strings.TrimSpace(l), "@"))}
		default:
			if chunk == nil {
				chunk = &v4aChunk{}
			}
			switch {
			case strings.HasPrefix(l, "-"):
				chunk.old = append(chunk.old, l[1:])
			case strings.HasPrefix(l, "+"):
				chunk.new = append(chunk.new, l[1:])
			case strings.HasPrefix(l, " "):
				chunk.old = append(chunk.old, l[1:])
				chunk.new = append(chunk.new, l[1:])
			case l == "":
				// A blank line inside a hunk is blank context.
				if i+1 < len(lines) {
					chunk.old = append(chunk.old, "")
					chunk.new = append(chunk.new, "")
				}
			default:
				return nil, fmt.Errorf("line %d: hunk lines must start with ' ', '-' or '+', got %q", i+1, l)
			}
		}
		if ended {
			break
		}
	}
	flushChunk()
	if !ended {
		return nil, errors.New("patch must end with '*** End Patch'")
	}
	if len(ops) == 0 {
		return nil, errors.New("patch has no file operations")
	}
	return ops, nil
}

// patchPaths lists the files a patch call touches (for scheduling).
func patchPaths(a Args) []string {
	if a.String("mode", "replace") != "patch" {
		return pathArg(a)
	}
	ops, err := parseV4A(a.String("patch", ""))
	if err != nil {
		return nil
	}
	var out []string
	for _, o := range ops {
		out = append(out, o.path)
	}
	return out
}

// findBlock finds old in lines at or after from: exact, then ignoring
// trailing whitespace, then ignoring surrounding whitespace.
func findBlock(lines, old []string, from int) int {
	norms := []func(string) string{
		func(s string) string { return s },
		func(s string) string { return strings.TrimRight(s, " \t\r") },
		strings.TrimSpace,
	}
	for _, norm := range norms {
		for i := from; i+len(old) <= len(lines); i++ {
			ok := true
			for k := range old {
				if norm(lines[i+k]) != norm(old[k]) {
					ok = false
					break
				}
			}
			if ok {
				return i
			}
		}
	}
	return -1
}

func applyChunks(content string, chunks []v4aChunk) (string, error) {
	trailingNL := strings.HasSuffix(content, "\n")
	lines := strings.Split(strings.TrimSuffix(content, "\n"), "\n")
	if content == "" {
		lines = nil
	}
	cursor := 0
	for n, c := range chunks {
		from := cursor
		if c.hint != "" {
			found := false
			for i := cursor; i < len(lines); i++ {
				if strings.Contains(lines[i], c.hint) {
					from, found = i, true
					break
				}
			}
			if !found {
				return "", fmt.Errorf("hunk %d: context line %q not found", n+1, c.hint)
			}
		}
		at := len(lines)
		if len(c.old) > 0 {
			at = findBlock(lines, c.old, from)
			if at < 0 {
				return "", fmt.Errorf("hunk %d: the context/removed lines were not found in the file (first: %q)", n+1, c.old[0])
			}
		}
		repl := append(append(append([]string{}, lines[:at]...), c.new...), lines[at+len(c.old):]...)
		lines = repl
		cursor = at + len(c.new)
	}
	out := strings.Join(lines, "\n")
	if trailingNL || content == "" {
		out += "\n"
	}
	return out, nil
}

func runV4APatch(ctx context.Context, rt *Runtime, text string) (string, error) {
	ops, err := parseV4A(text)
	if err != nil {
		return patchFail("Invalid V4A patch: "+err.Error(), ""), nil
	}
	// Compute everything first so that a failing hunk changes no file.
	var plan []v4aPlanned
	for _, o := range ops {
		pl, fail, err := planV4AOp(ctx, rt, o)
		if fail != "" || err != nil {
			return fail, err
		}
		plan = append(plan, pl)
	}
	var diffs []string
	modified, created, deleted := []string{}, []string{}, []string{}
	for _, pl := range plan {
		if fail, err := applyV4AOp(ctx, rt, pl); fail != "" || err != nil {
			return fail, err
		}
		switch pl.op.kind {
		case "delete":
			deleted = append(deleted, pl.abs)
		case "add":
			created = append(created, pl.abs)
		default:
			modified = append(modified, pl.abs)
		}
		diffs = append(diffs, UnifiedDiff(pl.abs, pl.before, pl.after))
	}
	r := map[string]any{"success": true, "diff": strings.Join(diffs, ""), "files_modified": modified}
	if len(created) > 0 {
		r["files_created"] = created
	}
	if len(deleted) > 0 {
		r["files_deleted"] = deleted
	}
	return marshal(r), nil
}

// v4aPlanned is one operation of a patch with the file's text before and
// after it.
type v4aPlanned struct {
	op            v4aOp
	abs           string
	before, after string
}

// v4aFail is the answer for a step that failed with err: an
// infrastructure error goes up as the error, anything else is the model's
// to fix and becomes a failed patch saying msg.
func v4aFail(ctx context.Context, err error, msg string) (string, error) {
	if infraOr(ctx, err) {
		return "", err
	}
	return patchFail(msg, ""), nil
}

// planV4AOp resolves o's path and computes the file's new text without
// writing anything. A non-empty fail is the tool's answer.
func planV4AOp(ctx context.Context, rt *Runtime, o v4aOp) (pl v4aPlanned, fail string, err error) {
	abs, err := rt.Resolve(ctx, o.path)
	if err != nil {
		fail, err = v4aFail(ctx, err, "Invalid path "+o.path+": "+err.Error())
		return pl, fail, err
	}
	if protectedPath(abs) {
		return pl, patchFail("Refusing to modify protected path "+abs, ""), nil
	}
	pl = v4aPlanned{op: o, abs: abs}
	if o.kind != "add" {
		data, err := rt.Sandbox.ReadFile(ctx, abs)
		if err != nil {
			if !infraOr(ctx, err) && errors.Is(err, sandbox.ErrNotFound) {
				return pl, patchFail("File not found: "+abs, ""), nil
			}
			fail, err = v4aFail(ctx, err, fmt.Sprintf("Could not read %s: %v", abs, err))
			return pl, fail, err
		}
		pl.before = string(data)
	}
	switch o.kind {
	case "add":
		pl.after = strings.Join(o.added, "\n")
		if len(o.added) > 0 {
			pl.after += "\n"
		}
	case "update":
		pl.after, err = applyChunks(pl.before, o.chunks)
		if err != nil {
			return pl, patchFail(fmt.Sprintf("%s: %v", abs, err), "Use read_file to see the exact current text and retry."), nil
		}
	}
	return pl, "", nil
}

// applyV4AOp carries out one planned operation: it deletes the file, or
// writes the new text and reads it back to verify it. A non-empty fail is
// the tool's answer.
func applyV4AOp(ctx context.Context, rt *Runtime, pl v4aPlanned) (fail string, err error) {
	if pl.op.kind == "delete" {
		res, err := rt.argv(ctx, 0, "rm", "-f", "--", pl.abs)
		if err != nil {
			return v4aFail(ctx, err, fmt.Sprintf("Failed to delete %s: %v", pl.abs, err))
		}
		if res.ExitCode != 0 {
			return patchFail(fmt.Sprintf("Failed to delete %s: %s", pl.abs, strings.TrimSpace(string(res.Stderr))), ""), nil
		}
		return "", nil
	}
	if _, err := writeKeepingMode(ctx, rt, pl.abs, []byte(pl.after)); err != nil {
		return v4aFail(ctx, err, fmt.Sprintf("Failed to write %s: %v", pl.abs, err))
	}
	check, err := rt.Sandbox.ReadFile(ctx, pl.abs)
	if err != nil {
		return v4aFail(ctx, err, fmt.Sprintf("Could not verify %s after writing: %v", pl.abs, err))
	}
	if string(check) != pl.after {
		return patchFail("Verification failed: "+pl.abs+" does not contain the intended content after writing", ""), nil
	}
	return "", nil
}
