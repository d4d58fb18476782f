package tools

import "testing"

func TestRepairName(t *testing.T) {
	set, err := Default().Resolve([]string{"terminal", "file"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"read_file", "", false},           // already a tool: nothing to repair
		{"Read_File", "read_file", true},   // case
		{"read-file", "read_file", true},   // hyphen
		{"READ FILE", "read_file", true},   // space
		{"functions.patch", "patch", true}, // OpenAI namespace
		{"search", "search_files", true},   // unique prefix
		{"write", "write_file", true},      // unique prefix
		{"re", "", false},                  // prefix too short
		{"read_files", "", false},          // not a prefix of anything
		{"memory", "", false},              // loop-only tool keeps its fixed answer
		{"", "", false},                    // nothing to repair
		{"proc", "process", true},          // unique prefix
		{"terminal_run", "", false},        // longer than the tool: no rule applies
		{"  Terminal ", "terminal", true},  // trimmed
	} {
		got, ok := set.RepairName(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("RepairName(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	// A prefix shared by two tools is not repaired; a unique one is.
	two := &Set{names: []string{"run_lint", "run_tests"}, byName: map[string]*entry{"run_lint": nil, "run_tests": nil}}
	if got, ok := two.RepairName("run"); ok {
		t.Errorf("RepairName(run) = %q; want no repair (two tools match)", got)
	}
	if got, ok := two.RepairName("run_t"); !ok || got != "run_tests" {
		t.Errorf("RepairName(run_t) = %q, %v; want run_tests", got, ok)
	}
}
