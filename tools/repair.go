package tools

import "strings"

// RepairName maps a near-miss tool name to the one tool of the set it
// unambiguously means; ok is false when name is already a tool of the set,
// or when no single tool matches. Two rules, in order:
//
//  1. equal after normalising both names: case folded, surrounding space
//     trimmed, a leading "functions." (OpenAI's namespace) dropped, and
//     '-', ' ' and '.' read as '_' ("Read-File" → read_file);
//  2. the normalised name is a prefix, at least 3 characters long, of the
//     normalised name of exactly one tool ("search" → search_files).
//
// Loop-only tools (memory, session_search, delegate_task) are never a
// repair target and a call to one is never repaired: it gets its fixed
// answer. The agent loop uses this only when the run enables
// loop.repair_tool_names.
func (s *Set) RepairName(name string) (repaired string, ok bool) {
	if _, exact := s.byName[name]; exact || name == "" {
		return "", false
	}
	if _, special := loopOnlyTools[name]; special {
		return "", false
	}
	n := normName(name)
	if n == "" {
		return "", false
	}
	var prefix []string
	for _, cand := range s.names {
		c := normName(cand)
		if c == n {
			return cand, true
		}
		if len(n) >= 3 && strings.HasPrefix(c, n) {
			prefix = append(prefix, cand)
		}
	}
	if len(prefix) == 1 {
		return prefix[0], true
	}
	return "", false
}

func normName(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "functions.")
	return strings.Map(func(r rune) rune {
		switch r {
		case '-', ' ', '.':
			return '_'
		}
		return r
	}, s)
}
