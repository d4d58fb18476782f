package trajectory

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Filter selects records for SFT and DPO exports. Infra failures are always
// dropped unless IncludeFailed: they say nothing about the model.
type Filter struct {
	// MinReward drops records with a lower reward (nil: no bound).
	MinReward *float64
	// TopK keeps the K highest-reward records of each group (0: all).
	TopK int
	// FinishedOnly drops rollouts that did not finish naturally
	// (truncated, max turns).
	FinishedOnly bool
	// IncludeFailed keeps infra_failed records.
	IncludeFailed bool
	// Dedupe drops records whose exported conversation repeats an earlier
	// one.
	Dedupe bool
}

// Select applies f (except Dedupe, which depends on the output format) and
// returns the kept records in input order.
func (f Filter) Select(recs []Record) []Record {
	keep := make([]bool, len(recs))
	for i := range recs {
		r := &recs[i]
		keep[i] = (f.IncludeFailed || r.Status == StatusOK) &&
			(!f.FinishedOnly || r.FinishedNaturally) &&
			(f.MinReward == nil || r.Reward >= *f.MinReward)
	}
	if f.TopK > 0 {
		byGroup := map[string][]int{}
		for i := range recs {
			if keep[i] {
				byGroup[recs[i].GroupID] = append(byGroup[recs[i].GroupID], i)
			}
		}
		for _, idx := range byGroup {
			sort.SliceStable(idx, func(a, b int) bool {
				ra, rb := &recs[idx[a]], &recs[idx[b]]
				if ra.Reward != rb.Reward {
					return ra.Reward > rb.Reward
				}
				return ra.RolloutIndex < rb.RolloutIndex
			})
			for _, i := range idx[min(f.TopK, len(idx)):] {
				keep[i] = false
			}
		}
	}
	var out []Record
	for i := range recs {
		if keep[i] {
			out = append(out, recs[i])
		}
	}
	return out
}

// SFT output formats.
const (
	FormatShareGPT = "sharegpt"
	FormatMessages = "messages"
)

// ExportStats counts what an export wrote and skipped.
type ExportStats struct {
	Read, Written, Filtered, Duplicates, Skipped int
}

// WriteSFT writes one JSONL line per selected record: ShareGPT
// {"conversations":[{"from","value"}…]} in the Hermes function-calling layout,
// or OpenAI {"messages":[…],"tools":[…]} with every message field kept.
//
// A gateway session exports its main branch (branch 0) only: the
// conversation exports are one conversation per rollout.
func WriteSFT(out io.Writer, recs []Record, format string, f Filter) (ExportStats, error) {
	recs = MainRows(recs)
	st := ExportStats{Read: len(recs)}
	if format != FormatShareGPT && format != FormatMessages {
		return st, fmt.Errorf("unknown SFT format %q (want %s or %s)", format, FormatShareGPT, FormatMessages)
	}
	sel := f.Select(recs)
	st.Filtered = len(recs) - len(sel)
	bw := bufio.NewWriter(out)
	seen := map[[32]byte]bool{}
	for i := range sel {
		r := &sel[i]
		var line any
		var key []byte
		switch format {
		case FormatShareGPT:
			conv, err := ShareGPT(r)
			if err != nil {
				return st, err
			}
			key, _ = json.Marshal(conv)
			line = struct {
				Conversations []ShareGPTTurn `json:"conversations"`
				Model         string         `json:"model,omitempty"`
				Env           string         `json:"env,omitempty"`
				ItemID        string         `json:"item_id,omitempty"`
				GroupID       string         `json:"group_id"`
				RolloutIndex  int32          `json:"rollout_index"`
				Reward        float64        `json:"reward"`
				Completed     bool           `json:"completed"`
			}{conv, r.Model, r.Env, r.ItemID, r.GroupID, r.RolloutIndex, r.Reward, r.FinishedNaturally}
		case FormatMessages:
			msgs, err := rawMessages(r)
			if err != nil {
				return st, err
			}
			tools, err := rawTools(r)
			if err != nil {
				return st, err
			}
			line = struct {
				Messages []json.RawMessage `json:"messages"`
				Tools    json.RawMessage   `json:"tools,omitempty"`
			}{msgs, tools}
			key, _ = json.Marshal(line)
		}
		if f.Dedupe {
			h := sha256.Sum256(key)
			if seen[h] {
				st.Duplicates++
				continue
			}
			seen[h] = true
		}
		b, err := marshalNoEscape(line)
		if err != nil {
			return st, fmt.Errorf("%s: encode: %w", recordRef(r), err)
		}
		if _, err := bw.Write(b); err != nil {
			return st, fmt.Errorf("write SFT export: %w", err)
		}
		st.Written++
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("write SFT export: %w", err)
	}
	return st, nil
}

// ShareGPTTurn is one turn of a ShareGPT conversation.
type ShareGPTTurn struct {
	From  string `json:"from"`
	Value string `json:"value"`
}

// ShareGPT converts a record's conversation to the Hermes ShareGPT layout:
// system (with the tool signatures in <tools>), human, gpt turns carrying
// <think> reasoning and <tool_call> blocks, and one tool turn per run of tool
// results with <tool_response> blocks.
func ShareGPT(r *Record) ([]ShareGPTTurn, error) {
	msgs, err := parseMessages(r)
	if err != nil {
		return nil, err
	}
	toolsBlock, err := toolsSystemBlock(r)
	if err != nil {
		return nil, err
	}
	var conv []ShareGPTTurn
	if len(msgs) == 0 || msgs[0].Role != "system" {
		if toolsBlock != "" {
			conv = append(conv, ShareGPTTurn{From: "system", Value: toolsBlock})
		}
	}
	var lastCalls []chatToolCall
	for i := 0; i < len(msgs); i++ {
		m := &msgs[i]
		switch m.Role {
		case "system", "developer":
			v := m.text()
			if toolsBlock != "" && len(conv) == 0 {
				v = strings.TrimSpace(v + "\n\n" + toolsBlock)
			}
			conv = append(conv, ShareGPTTurn{From: "system", Value: v})
		case "user":
			conv = append(conv, ShareGPTTurn{From: "human", Value: m.text()})
		case "assistant":
			v, err := gptValue(m)
			if err != nil {
				return nil, fmt.Errorf("%s: message %d: %w", recordRef(r), i, err)
			}
			conv = append(conv, ShareGPTTurn{From: "gpt", Value: v})
			lastCalls = m.ToolCalls
		case "tool":
			var parts []string
			for pos := 0; i < len(msgs) && msgs[i].Role == "tool"; i, pos = i+1, pos+1 {
				parts = append(parts, toolResponse(&msgs[i], lastCalls, pos))
			}
			i--
			conv = append(conv, ShareGPTTurn{From: "tool", Value: strings.Join(parts, "\n")})
		default:
			return nil, fmt.Errorf("%s: message %d has unknown role %q", recordRef(r), i, m.Role)
		}
	}
	return conv, nil
}

// toolsSystemBlock states the available functions the way Hermes-format
// models were trained to see them.
func toolsSystemBlock(r *Record) (string, error) {
	tools, err := functionTools(r)
	if err != nil {
		return "", err
	}
	if tools == nil {
		return "", nil
	}
	var sigs []string
	for _, t := range tools {
		params := "{}"
		if len(t.Function.Parameters) > 0 {
			if p, err := pyJSON(t.Function.Parameters); err == nil {
				params = p
			}
		}
		name, _ := pyJSON(mustJSON(t.Function.Name))
		desc, _ := pyJSON(mustJSON(t.Function.Description))
		sigs = append(sigs, fmt.Sprintf(`{"name": %s, "description": %s, "parameters": %s}`, name, desc, params))
	}
	return "You can call functions to help with the task. Their signatures are listed inside <tools></tools>:\n<tools>\n[" +
		strings.Join(sigs, ", ") + "]\n</tools>\nTo call a function, write a JSON object with \"name\" and \"arguments\" inside <tool_call></tool_call> tags.", nil
}

// functionTool is an OpenAI chat function tool of the tools column.
type functionTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      bool            `json:"strict"`
	} `json:"function"`
}

// functionTools parses the tools column; nil when it has none.
func functionTools(r *Record) ([]functionTool, error) {
	raw, err := rawTools(r)
	if err != nil || raw == nil {
		return nil, err
	}
	var tools []functionTool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, fmt.Errorf("%s: tools column is not a list of function tools: %w", recordRef(r), err)
	}
	return tools, nil
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func gptValue(m *chatMessage) (string, error) {
	var b strings.Builder
	if r := m.reasoning(); r != "" {
		b.WriteString("<think>\n" + r + "\n</think>\n")
	}
	content := strings.NewReplacer("<REASONING_SCRATCHPAD>", "<think>", "</REASONING_SCRATCHPAD>", "</think>").Replace(m.text())
	b.WriteString(content)
	for _, c := range m.ToolCalls {
		args := strings.TrimSpace(c.Function.Arguments)
		if args == "" {
			args = "{}"
		}
		argJSON, err := pyJSON([]byte(args))
		if err != nil || !json.Valid([]byte(args)) {
			// Keep malformed arguments visible as a string rather than
			// inventing a structure.
			argJSON, _ = pyJSON(mustJSON(c.Function.Arguments))
		}
		name, _ := pyJSON(mustJSON(c.Function.Name))
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
		b.WriteString("<tool_call>\n{\"name\": " + name + ", \"arguments\": " + argJSON + "}\n</tool_call>\n")
	}
	v := b.String()
	if !strings.Contains(v, "<think>") {
		v = "<think>\n</think>\n" + v
	}
	return strings.TrimRight(v, " \n\t"), nil
}

func toolResponse(m *chatMessage, calls []chatToolCall, pos int) string {
	name := m.Name
	if name == "" {
		for _, c := range calls {
			if c.ID == m.ToolCallID {
				name = c.Function.Name
			}
		}
	}
	if name == "" && pos < len(calls) {
		name = calls[pos].Function.Name
	}
	text := m.text()
	content, _ := pyJSON(mustJSON(text))
	if t := strings.TrimSpace(text); (strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[")) && json.Valid([]byte(t)) {
		if p, err := pyJSON([]byte(t)); err == nil {
			content = p
		}
	}
	id, _ := pyJSON(mustJSON(m.ToolCallID))
	nm, _ := pyJSON(mustJSON(name))
	return "<tool_response>\n{\"tool_call_id\": " + id + ", \"name\": " + nm + ", \"content\": " + content + "}\n</tool_response>"
}

// groupRecords returns the records of each group in first-seen order, each
// group sorted by rollout index, then branch.
func groupRecords(recs []Record) [][]*Record {
	idx := map[string]int{}
	var groups [][]*Record
	for i := range recs {
		g, ok := idx[recs[i].GroupID]
		if !ok {
			g = len(groups)
			idx[recs[i].GroupID] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], &recs[i])
	}
	for _, g := range groups {
		sort.SliceStable(g, func(a, b int) bool {
			if g[a].RolloutIndex != g[b].RolloutIndex {
				return g[a].RolloutIndex < g[b].RolloutIndex
			}
			return g[a].Branch < g[b].Branch
		})
	}
	return groups
}

// DPOOptions configures WriteDPO.
type DPOOptions struct {
	Filter Filter
	// MinMargin is the smallest reward gap between chosen and rejected
	// (pairs with equal rewards are never written).
	MinMargin float64
	// PairsPerGroup pairs the i-th best with the i-th worst record (1).
	PairsPerGroup int
}

// WriteDPO writes chosen/rejected pairs from within each group, in the TRL
// conversational preference layout: {"prompt": shared leading messages,
// "chosen": rest of the better rollout, "rejected": rest of the worse one,
// "tools", "score_chosen", "score_rejected"}.
//
// Pairs are built from main branches (branch 0) only, as for WriteSFT.
func WriteDPO(out io.Writer, recs []Record, opts DPOOptions) (ExportStats, error) {
	recs = MainRows(recs)
	st := ExportStats{Read: len(recs)}
	if opts.PairsPerGroup <= 0 {
		opts.PairsPerGroup = 1
	}
	f := opts.Filter
	f.TopK = 0
	sel := f.Select(recs)
	st.Filtered = len(recs) - len(sel)
	bw := bufio.NewWriter(out)
	seen := map[[32]byte]bool{}
	for _, g := range groupRecords(sel) {
		sort.SliceStable(g, func(a, b int) bool { return g[a].Reward > g[b].Reward })
		for i := 0; i < opts.PairsPerGroup && i < len(g)-1-i; i++ {
			c, r := g[i], g[len(g)-1-i]
			if c.Reward-r.Reward <= 0 || c.Reward-r.Reward < opts.MinMargin {
				st.Skipped++
				continue
			}
			cm, err := rawMessages(c)
			if err != nil {
				return st, err
			}
			rm, err := rawMessages(r)
			if err != nil {
				return st, err
			}
			p := sharedPromptLen(c, cm, rm)
			tools, err := rawTools(c)
			if err != nil {
				return st, err
			}
			line := struct {
				Prompt        []json.RawMessage `json:"prompt"`
				Chosen        []json.RawMessage `json:"chosen"`
				Rejected      []json.RawMessage `json:"rejected"`
				Tools         json.RawMessage   `json:"tools,omitempty"`
				ScoreChosen   float64           `json:"score_chosen"`
				ScoreRejected float64           `json:"score_rejected"`
				Env           string            `json:"env,omitempty"`
				ItemID        string            `json:"item_id,omitempty"`
				GroupID       string            `json:"group_id"`
			}{cm[:p], cm[p:], rm[p:], tools, c.Reward, r.Reward, c.Env, c.ItemID, c.GroupID}
			b, err := marshalNoEscape(line)
			if err != nil {
				return st, fmt.Errorf("%s: encode DPO pair: %w", recordRef(c), err)
			}
			if opts.Filter.Dedupe {
				h := sha256.Sum256(b)
				if seen[h] {
					st.Duplicates++
					continue
				}
				seen[h] = true
			}
			if _, err := bw.Write(b); err != nil {
				return st, fmt.Errorf("write DPO export: %w", err)
			}
			st.Written++
		}
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("write DPO export: %w", err)
	}
	return st, nil
}

// sharedPromptLen is the number of leading messages both rollouts share
// before the first assistant message.
func sharedPromptLen(c *Record, a, b []json.RawMessage) int {
	msgs, _ := parseMessages(c)
	n := 0
	for n < len(a) && n < len(b) && n < len(msgs) && msgs[n].Role != "assistant" && jsonEqual(a[n], b[n]) {
		n++
	}
	return n
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// AtroposOptions configures WriteAtropos.
type AtroposOptions struct {
	// EnvID is added as env_id when set (as /scored_data expects from a
	// registered env; process-mode files have none).
	EnvID *int
	// GroupSize is the registered group size; a group with fewer usable
	// rollouts gets group_overrides.group_size. 0: the largest group in the
	// export.
	GroupSize int
	// ZeroAdvantageOnTruncation sets overrides[i].set_advantage_to_zero for
	// rollouts stopped by the length limit.
	ZeroAdvantageOnTruncation bool
	// IncludeMessages adds the conversations (messages).
	IncludeMessages bool
}

// ScoredDataGroup is one Atropos group as POSTed to /scored_data. Keys and
// null handling follow the API's pydantic model.
type ScoredDataGroup struct {
	Tokens            [][]int32           `json:"tokens"`
	Masks             [][]int32           `json:"masks"`
	Scores            []float64           `json:"scores"`
	Advantages        [][]float64         `json:"advantages,omitempty"`
	Messages          [][]json.RawMessage `json:"messages,omitempty"`
	GenerationParams  map[string]any      `json:"generation_params,omitempty"`
	InferenceLogprobs [][]float32         `json:"inference_logprobs,omitempty"`
	GroupOverrides    map[string]any      `json:"group_overrides,omitempty"`
	Overrides         []map[string]any    `json:"overrides,omitempty"`
	EnvID             *int                `json:"env_id,omitempty"`
	// DistillTokenIDs and DistillLogprobs are [seq][pos][k]: the teacher's
	// top-K at each trained position, K zeros elsewhere (Hermes' agentic
	// OPD layout; trainers read them under masks). Set only when some
	// record of the group has distillation data.
	DistillTokenIDs [][][]int32   `json:"distill_token_ids,omitempty"`
	DistillLogprobs [][][]float32 `json:"distill_logprobs,omitempty"`
	// RoutedExperts is [seq][pos][layer][k]: the experts the engine routed
	// each token to, aligned to tokens (verl's per-sample routed_experts
	// layout, (seq_len, layers, topk)), zeros at the positions the engine
	// reported none for (the last sampled token, the template closing). Set
	// only when the group's records carry routing.
	RoutedExperts [][][][]uint16 `json:"routed_experts,omitempty"`
}

// atroposDistill fills the group's distill_* from its records: K is the
// widest teacher list; positions (and records) without data get K zeros.
func atroposDistill(sd *ScoredDataGroup, g []*Record) {
	k := 0
	for _, r := range g {
		for _, ids := range r.DistillTokenIDs {
			k = max(k, len(ids))
		}
	}
	if k == 0 {
		return
	}
	for _, r := range g {
		ids := make([][]int32, len(r.Tokens))
		lps := make([][]float32, len(r.Tokens))
		for p := range r.Tokens {
			ids[p], lps[p] = make([]int32, k), make([]float32, k)
			if p < len(r.DistillTokenIDs) {
				copy(ids[p], r.DistillTokenIDs[p])
				copy(lps[p], r.DistillLogprobs[p])
			}
		}
		sd.DistillTokenIDs = append(sd.DistillTokenIDs, ids)
		sd.DistillLogprobs = append(sd.DistillLogprobs, lps)
	}
}

// ErrNoTokens is returned by AtroposGroups when a usable record has no token
// ids (a chat-mode run cannot feed a token-level trainer).
var ErrNoTokens = errors.New("record has no token ids")

// AtroposGroups builds one ScoredDataGroup per group from the ok records
// (infra failures are never sent to a trainer). Every branch of a gateway
// session is its own sequence in its group, with the session's score and
// advantage; a group with more sequences than GroupSize says so in
// group_overrides.group_size.
func AtroposGroups(recs []Record, opts AtroposOptions) ([]ScoredDataGroup, ExportStats, error) {
	ok, st := trainableRecords(recs, Filter{})
	groups := groupRecords(ok)
	size := opts.GroupSize
	if size == 0 {
		for _, g := range groups {
			size = max(size, len(g))
		}
	}
	var out []ScoredDataGroup
	for _, g := range groups {
		sd := ScoredDataGroup{EnvID: opts.EnvID}
		allLogprobs, allAdv := true, true
		anyOverride := false
		for _, r := range g {
			if len(r.Tokens) == 0 {
				return nil, st, fmt.Errorf("%s: %w; atropos export needs a tokens-mode run", recordRef(r), ErrNoTokens)
			}
			sd.Tokens = append(sd.Tokens, r.Tokens)
			sd.Masks = append(sd.Masks, r.Masks)
			sd.Scores = append(sd.Scores, r.Reward)
			sd.InferenceLogprobs = append(sd.InferenceLogprobs, r.Logprobs)
			allLogprobs = allLogprobs && len(r.Logprobs) == len(r.Tokens)
			if r.Advantage != nil {
				adv := make([]float64, len(r.Tokens))
				for i := range adv {
					adv[i] = *r.Advantage
				}
				sd.Advantages = append(sd.Advantages, adv)
			} else {
				allAdv = false
			}
			ov := map[string]any{}
			if opts.ZeroAdvantageOnTruncation && r.StopReason == StopLength {
				ov["set_advantage_to_zero"] = true
				anyOverride = true
			}
			sd.Overrides = append(sd.Overrides, ov)
			if opts.IncludeMessages {
				msgs, err := atroposMessages(r)
				if err != nil {
					return nil, st, err
				}
				sd.Messages = append(sd.Messages, msgs)
			}
		}
		if !allLogprobs {
			sd.InferenceLogprobs = nil
		}
		if !allAdv {
			sd.Advantages = nil
		}
		if !anyOverride {
			sd.Overrides = nil
		}
		var sp map[string]any
		if json.Unmarshal([]byte(g[0].SamplingParams), &sp) == nil {
			if t, ok := sp["temperature"]; ok {
				sd.GenerationParams = map[string]any{"temperature": t}
			}
		}
		if len(g) != size {
			sd.GroupOverrides = map[string]any{"group_size": len(g)}
		}
		atroposDistill(&sd, g)
		experts, err := groupExperts(g)
		if err != nil {
			return nil, st, err
		}
		sd.RoutedExperts = experts
		out = append(out, sd)
		st.Written++
	}
	return out, st, nil
}

// atroposMessages passes messages through, replacing a null content (an
// assistant turn with only tool calls) by "" because the API requires a
// string or a list of parts.
func atroposMessages(r *Record) ([]json.RawMessage, error) {
	msgs, err := rawMessages(r)
	if err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, len(msgs))
	for i, m := range msgs {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(m, &obj); err != nil {
			return nil, fmt.Errorf("%s: message %d is not an object: %w", recordRef(r), i, err)
		}
		if c, ok := obj["content"]; !ok || string(c) == "null" {
			obj["content"] = json.RawMessage(`""`)
			b, _ := json.Marshal(obj)
			out[i] = b
		} else {
			out[i] = m
		}
	}
	return out, nil
}

// WriteAtropos writes one ScoredDataGroup JSON object per line, the layout of
// Atropos' data_path_to_save_groups files and of /scored_data bodies.
func WriteAtropos(out io.Writer, recs []Record, opts AtroposOptions) (ExportStats, error) {
	groups, st, err := AtroposGroups(recs, opts)
	return writeLines(out, "atropos", groups, st, err)
}
