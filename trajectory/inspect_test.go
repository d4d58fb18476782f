package trajectory

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

func TestSummaryGolden(t *testing.T) {
	recs := fixtureRecords()
	dir := writeFixtureRun(t, recs)
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(run, got)
	if s.Rows != 6 || s.OK != 5 || s.Failed != 1 || s.Groups != 2 || s.FailureKinds["sandbox_start"].Count != 1 {
		t.Errorf("summary = %+v", s)
	}
	if s.Sampled != 21 || s.Unscored != 1 {
		t.Errorf("sampled %d, unscored %d: want 21 (20 trained + 1), 1", s.Sampled, s.Unscored)
	}
	if c := s.CallParse["hermes"]; c[CallMalformed] != 1 || c[CallRepaired] != 1 || c[CallOK] != 1 {
		t.Errorf("call parsing %v", s.CallParse)
	}
	if s.CallSpans["hermes"] != 2 { // the fixture's repaired call has no span
		t.Errorf("calls with a token span %v, want hermes 2", s.CallSpans)
	}
	// run.json counts the same.
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Counts.SampledTokens != 21 || m.Counts.UnscoredTokens != 1 || m.Counts.UnscoredShare() != 1.0/21 {
		t.Errorf("run.json counts %+v", m.Counts)
	}
	if s.Phases[0].Name != "sandbox_start" {
		t.Errorf("slowest phase = %s, want sandbox_start", s.Phases[0].Name)
	}
	var buf bytes.Buffer
	if err := WriteSummary(&buf, "RUN", s); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "inspect_summary.txt", buf.Bytes())
}

func TestHTMLSelfContainedAndEscaped(t *testing.T) {
	recs := fixtureRecords()
	recs[1].Messages = `[{"role":"user","content":"</script><script>alert(1)</script>"}]`
	var buf bytes.Buffer
	if err := WriteHTML(&buf, recs, HTMLOptions{Title: "fixture <run>"}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`).MatchString(page) || strings.Contains(page, "<link") {
		t.Error("page references external assets")
	}
	if strings.Count(page, "</script>") != 2 {
		t.Errorf("record content broke out of the data script: %d </script> tags", strings.Count(page, "</script>"))
	}
	if !strings.Contains(page, "fixture &lt;run&gt;") {
		t.Error("title not escaped")
	}
	m := regexp.MustCompile(`(?s)<script id="data" type="application/json">(.*?)</script>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no data script")
	}
	var view []map[string]any
	if err := json.Unmarshal([]byte(m[1]), &view); err != nil {
		t.Fatalf("embedded data is not JSON: %v", err)
	}
	if len(view) != len(recs) || view[0]["group_id"] != "g-1" || len(view[0]["tokens"].([]any)) != 9 {
		t.Errorf("embedded %d records: %v", len(view), view[0]["group_id"])
	}
	if got := view[1]["messages"].([]any)[0].(map[string]any)["content"]; got != "</script><script>alert(1)</script>" {
		t.Errorf("content round trip = %q", got)
	}
	// A session branch and the tool calls' parse statuses reach the page.
	recs[2].SessionID, recs[2].Branch, recs[2].ParentBranch, recs[2].SplitCall, recs[2].SharedTokens = "sess-1", 1, 0, 3, 40
	recs[2].CallStatuses = []CallStatus{{Turn: 1, Index: 0, Name: "terminal", Status: CallMalformed, Reason: "call is truncated", SpanStart: 5, SpanEnd: 9}}
	buf.Reset()
	if err := WriteHTML(&buf, recs, HTMLOptions{}); err != nil {
		t.Fatal(err)
	}
	m = regexp.MustCompile(`(?s)<script id="data" type="application/json">(.*?)</script>`).FindStringSubmatch(buf.String())
	if m == nil || json.Unmarshal([]byte(m[1]), &view) != nil {
		t.Fatal("no data script")
	}
	cs, _ := view[2]["call_statuses"].([]any)
	if view[2]["branch"] != 1.0 || view[2]["split_call"] != 3.0 || view[2]["session_id"] != "sess-1" || len(cs) != 1 ||
		cs[0].(map[string]any)["status"] != CallMalformed || cs[0].(map[string]any)["span_end"] != 9.0 {
		t.Errorf("branch and call statuses not embedded: %v %v", view[2]["branch"], cs)
	}
	if !strings.Contains(buf.String(), `"tool call"`) || !strings.Contains(buf.String(), `" branch "`) {
		t.Error("the viewer does not render call statuses or branches")
	}
	buf.Reset()
	if err := WriteHTML(&buf, recs, HTMLOptions{Limit: 2}); err != nil || !strings.Contains(buf.String(), "6 trajectories, first 2 embedded") {
		t.Errorf("limit: %v", err)
	}
}
