package tools

import (
	"fmt"
	"strings"
)

// UnifiedDiff renders a unified diff (a/ b/ prefixes, 3 lines of context)
// between two versions of file p.
func UnifiedDiff(p, before, after string) string {
	if before == after {
		return ""
	}
	a, b := splitLines(before), splitLines(after)
	ops := diffLines(a, b)
	p = strings.TrimPrefix(p, "/")
	var out strings.Builder
	fmt.Fprintf(&out, "--- a/%s\n+++ b/%s\n", p, p)
	const ctx = 3
	// Group ops into hunks: runs of changes separated by > 2*ctx equal lines.
	i := 0
	for i < len(ops) {
		for i < len(ops) && ops[i].kind == ' ' {
			i++
		}
		if i >= len(ops) {
			break
		}
		start := max(0, i-ctx)
		end := i
		for {
			for end < len(ops) && ops[end].kind != ' ' {
				end++
			}
			eq := end
			for eq < len(ops) && ops[eq].kind == ' ' {
				eq++
			}
			if eq < len(ops) && eq-end <= 2*ctx {
				end = eq
				continue
			}
			end = min(len(ops), end+ctx)
			break
		}
		aStart, bStart, aN, bN := ops[start].ai, ops[start].bi, 0, 0
		for _, o := range ops[start:end] {
			if o.kind != '+' {
				aN++
			}
			if o.kind != '-' {
				bN++
			}
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", hunkRange(aStart, aN), hunkRange(bStart, bN))
		for _, o := range ops[start:end] {
			out.WriteByte(o.kind)
			out.WriteString(strings.TrimSuffix(o.text, "\n"))
			out.WriteByte('\n')
			if !strings.HasSuffix(o.text, "\n") {
				out.WriteString("\\ No newline at end of file\n")
			}
		}
		i = end
	}
	return out.String()
}

func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	l := strings.SplitAfter(s, "\n")
	if l[len(l)-1] == "" {
		l = l[:len(l)-1]
	}
	return l
}

type diffOp struct {
	kind   byte // ' ', '-', '+'
	text   string
	ai, bi int // position in a and b before this op
}

// diffLines: common prefix/suffix, then an LCS table on the middle when it
// is small enough, else the middle as one replacement.
func diffLines(a, b []string) []diffOp {
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	var ops []diffOp
	for i := 0; i < pre; i++ {
		ops = append(ops, diffOp{' ', a[i], i, i})
	}
	am, bm := a[pre:len(a)-suf], b[pre:len(b)-suf]
	ai, bi := pre, pre
	if len(am)*len(bm) <= 4_000_000 {
		n, m := len(am), len(bm)
		lcs := make([][]int32, n+1)
		for i := range lcs {
			lcs[i] = make([]int32, m+1)
		}
		for i := n - 1; i >= 0; i-- {
			for j := m - 1; j >= 0; j-- {
				if am[i] == bm[j] {
					lcs[i][j] = lcs[i+1][j+1] + 1
				} else {
					lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
				}
			}
		}
		i, j := 0, 0
		for i < n || j < m {
			switch {
			case i < n && j < m && am[i] == bm[j]:
				ops = append(ops, diffOp{' ', am[i], ai, bi})
				i, j, ai, bi = i+1, j+1, ai+1, bi+1
			case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
				ops = append(ops, diffOp{'-', am[i], ai, bi})
				i, ai = i+1, ai+1
			default:
				ops = append(ops, diffOp{'+', bm[j], ai, bi})
				j, bi = j+1, bi+1
			}
		}
	} else {
		for _, l := range am {
			ops = append(ops, diffOp{'-', l, ai, bi})
			ai++
		}
		for _, l := range bm {
			ops = append(ops, diffOp{'+', l, ai, bi})
			bi++
		}
	}
	for k := 0; k < suf; k++ {
		ops = append(ops, diffOp{' ', a[len(a)-suf+k], ai, bi})
		ai, bi = ai+1, bi+1
	}
	return ops
}
