package parsers

import (
	"reflect"
	"testing"
)

// Each call's parse outcome, in output order: ok as written, repaired
// (what the parser fixed), malformed (the CallError's reason).
func TestStatusesHermes(t *testing.T) {
	p, err := Get("hermes")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, text string
		want       []CallStatus
	}{
		{"none", "just an answer", nil},
		{"ok", `<tool_call>{"name": "ls", "arguments": {"path": "/"}}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusOK}}},
		{"string arguments", `<tool_call>{"name": "ls", "arguments": "{\"path\": \"/\"}"}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairArgsString}}},
		{"close missing at the end", `<tool_call>{"name": "ls", "arguments": {}}`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairCloseMissing}}},
		{"both repairs", `<tool_call>{"name": "ls", "arguments": "{}"}`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairArgsString + "; " + RepairCloseMissing}}},
		{"malformed between ok ones",
			`<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": [1]}</tool_call><tool_call>{"name": "c", "arguments": {}}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "a", Status: StatusOK}, {Index: 1, Name: "b", Status: StatusMalformed, Reason: "arguments: arguments are a JSON array, not an object"}, {Index: 2, Name: "c", Status: StatusOK}}},
		{"truncated", `<tool_call>{"name": "ls", "argu`,
			[]CallStatus{{Index: 0, Status: StatusMalformed, Reason: "call is truncated"}}},
	} {
		got := Statuses(p.Parse(tc.text, nil))
		if tc.name == "truncated" {
			// The reason's wording is the family's; only its kind is fixed.
			if len(got) != 1 || got[0].Status != StatusMalformed || got[0].Reason == "" {
				t.Errorf("%s: %+v", tc.name, got)
			}
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}
