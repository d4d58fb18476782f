package trajectory

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// NeMoGymRollout is one line of a NeMo Gym rollouts file (what
// ng_collect_rollouts writes: an agent's /run result, a BaseVerifyResponse
// with the bookkeeping keys): the request, the Responses-API response with
// its output items, the reward, and NeMo Gym's indices.
type NeMoGymRollout struct {
	ResponsesCreateParams NeMoGymCreateParams `json:"responses_create_params"`
	Response              NeMoGymResponse     `json:"response"`
	Reward                float64             `json:"reward"`
	// RewardComponents as BaseMultiRewardVerifyResponse carries them.
	RewardComponents map[string]float64 `json:"reward_components,omitempty"`
	// TaskIndex is the group's position in the export (_ng_task_index
	// groups a task's rollouts); RolloutIndex the rollout's in its group.
	TaskIndex    int        `json:"_ng_task_index"`
	RolloutIndex int32      `json:"_ng_rollout_index"`
	Rollout      RolloutRef `json:"rollout"`
}

// NeMoGymCreateParams is the request part the export can state: the
// prompt as input items, the tools, and the sampling fields the run used.
type NeMoGymCreateParams struct {
	Input           []NeMoGymItem `json:"input"`
	Tools           []NeMoGymTool `json:"tools,omitempty"`
	Temperature     *float64      `json:"temperature,omitempty"`
	TopP            *float64      `json:"top_p,omitempty"`
	MaxOutputTokens *int          `json:"max_output_tokens,omitempty"`
}

// NeMoGymTool is a Responses-API function tool.
type NeMoGymTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      bool            `json:"strict"`
}

// NeMoGymResponse is the Responses-API response object of the rollout.
type NeMoGymResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Model             string             `json:"model"`
	Status            string             `json:"status"`
	IncompleteDetails *NeMoGymIncomplete `json:"incomplete_details"`
	Output            []NeMoGymItem      `json:"output"`
	ParallelToolCalls bool               `json:"parallel_tool_calls"`
	ToolChoice        string             `json:"tool_choice"`
	Tools             []NeMoGymTool      `json:"tools"`
	Usage             NeMoGymUsage       `json:"usage"`
}

// NeMoGymIncomplete says why a response is incomplete.
type NeMoGymIncomplete struct {
	Reason string `json:"reason"`
}

// NeMoGymUsage is the response's token usage.
type NeMoGymUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

// NeMoGymItem is one Responses input or output item: a message, a
// reasoning item, a function call or a function call's output. The item
// that ends a generation carries its token fields (*NeMoGymTokens).
type NeMoGymItem struct {
	ID        string        `json:"id,omitempty"`
	Type      string        `json:"type,omitempty"`
	Role      string        `json:"role,omitempty"`
	Status    string        `json:"status,omitempty"`
	Content   any           `json:"content,omitempty"`
	Summary   []NeMoGymText `json:"summary,omitempty"`
	CallID    string        `json:"call_id,omitempty"`
	Name      string        `json:"name,omitempty"`
	Arguments *string       `json:"arguments,omitempty"`
	Output    *string       `json:"output,omitempty"`
	*NeMoGymTokens
}

// NeMoGymText is an output_text content part or a summary_text part.
type NeMoGymText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations,omitempty"`
}

// NeMoGymTokens are NeMo Gym's training fields of one generation
// (TokenIDLogProbMixin): PromptTokenIDs every token before it (prefix-
// contiguous: each generation's prompt extends the previous prompt and
// generation), GenerationTokenIDs the sampled ids, GenerationLogProbs their
// logprobs, RoutedExperts [prompt+generation][layers][topk].
type NeMoGymTokens struct {
	PromptTokenIDs     []int32      `json:"prompt_token_ids"`
	GenerationTokenIDs []int32      `json:"generation_token_ids"`
	GenerationLogProbs []float32    `json:"generation_log_probs"`
	RoutedExperts      [][][]uint16 `json:"routed_experts,omitempty"`
}

// NeMoGymRollouts builds one rollout line per selected record, every branch
// of a gateway session its own line. Records of a chat-mode run have no
// token fields (NeMo Gym's evaluation layout). A tokens-mode record whose
// trained runs do not pair one to one with its assistant turns (a sampled
// id without a logprob splitting a generation, an echoed turn the gateway
// could not anchor) or without logprobs cannot say which tokens belong to
// which output item: it is skipped and counted in ExportStats.Skipped.
func NeMoGymRollouts(recs []Record, f Filter) ([]NeMoGymRollout, ExportStats, error) {
	sel, st := trainableRecords(recs, f)
	var out []NeMoGymRollout
	for task, g := range groupRecords(sel) {
		for _, r := range g {
			line, ok, err := nemoGymRollout(r, task)
			if err != nil {
				return nil, st, err
			}
			if !ok {
				st.Skipped++
				continue
			}
			out = append(out, line)
			st.Written++
		}
	}
	return out, st, nil
}

func nemoGymRollout(r *Record, task int) (NeMoGymRollout, bool, error) {
	msgs, err := parseMessages(r)
	if err != nil {
		return NeMoGymRollout{}, false, err
	}
	tools, err := nemoGymTools(r)
	if err != nil {
		return NeMoGymRollout{}, false, err
	}
	p := 0
	for p < len(msgs) && msgs[p].Role != "assistant" {
		p++
	}
	params := NeMoGymCreateParams{Input: []NeMoGymItem{}, Tools: tools}
	for _, m := range msgs[:p] {
		params.Input = append(params.Input, NeMoGymItem{Role: m.Role, Content: m.text()})
	}
	var sp struct {
		Temperature *float64 `json:"temperature"`
		TopP        *float64 `json:"top_p"`
		MaxTokens   *int     `json:"max_tokens"`
		MaxComp     *int     `json:"max_completion_tokens"`
	}
	if strings.TrimSpace(r.SamplingParams) != "" {
		if err := json.Unmarshal([]byte(r.SamplingParams), &sp); err != nil {
			return NeMoGymRollout{}, false, fmt.Errorf("%s: sampling_params: %w", recordRef(r), err)
		}
	}
	params.Temperature, params.TopP, params.MaxOutputTokens = sp.Temperature, sp.TopP, sp.MaxTokens
	if sp.MaxComp != nil {
		params.MaxOutputTokens = sp.MaxComp
	}

	gens, layers, topk, ok, err := nemoGymGenerations(r, msgs[p:])
	if err != nil || !ok {
		return NeMoGymRollout{}, ok, err
	}
	var output []NeMoGymItem
	turn := 0
	for i := p; i < len(msgs); i++ {
		m := &msgs[i]
		id := func(prefix string) string { return fmt.Sprintf("%s_%d", prefix, len(output)) }
		switch m.Role {
		case "assistant":
			if rs := m.reasoning(); rs != "" {
				output = append(output, NeMoGymItem{ID: id("rs"), Type: "reasoning", Summary: []NeMoGymText{{Type: "summary_text", Text: rs}}})
			}
			if t := m.text(); t != "" || len(m.ToolCalls) == 0 {
				output = append(output, NeMoGymItem{ID: id("msg"), Type: "message", Role: "assistant", Status: "completed",
					Content: []NeMoGymText{{Type: "output_text", Text: t, Annotations: []any{}}}})
			}
			for _, c := range m.ToolCalls {
				args := c.Function.Arguments
				output = append(output, NeMoGymItem{ID: id("fc"), Type: "function_call", CallID: c.ID, Name: c.Function.Name, Arguments: &args, Status: "completed"})
			}
			if gens != nil {
				g := gens[turn]
				if layers > 0 {
					g.RoutedExperts = expertsRows(r, len(g.PromptTokenIDs)+len(g.GenerationTokenIDs), layers, topk)
				}
				output[len(output)-1].NeMoGymTokens = &g
			}
			turn++
		case "tool":
			text := m.text()
			output = append(output, NeMoGymItem{Type: "function_call_output", CallID: m.ToolCallID, Output: &text})
		default:
			output = append(output, NeMoGymItem{Type: "message", Role: m.Role, Content: m.text()})
		}
	}
	if output == nil {
		output = []NeMoGymItem{}
	}

	resp := NeMoGymResponse{
		ID: fmt.Sprintf("resp_%s_%d", r.SessionID, r.Branch), Object: "response", CreatedAt: r.CreatedAt.Unix(), Model: r.Model,
		Status: "completed", Output: output, ParallelToolCalls: true, ToolChoice: "auto", Tools: tools,
		Usage: NeMoGymUsage{InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}},
	}
	if resp.Tools == nil {
		resp.Tools = []NeMoGymTool{}
	}
	if r.StopReason == StopLength {
		resp.Status, resp.IncompleteDetails = "incomplete", &NeMoGymIncomplete{Reason: "max_output_tokens"}
	}
	if len(gens) > 0 {
		resp.Usage.InputTokens = len(gens[0].PromptTokenIDs)
		for _, g := range gens {
			resp.Usage.OutputTokens += len(g.GenerationTokenIDs)
		}
	} else {
		resp.Usage.InputTokens, resp.Usage.OutputTokens = int(r.PromptTokens), int(r.CompletionTokens)
	}
	resp.Usage.TotalTokens = resp.Usage.InputTokens + resp.Usage.OutputTokens
	return NeMoGymRollout{
		ResponsesCreateParams: params, Response: resp, Reward: r.Reward, RewardComponents: r.RewardComponents,
		TaskIndex: task, RolloutIndex: r.RolloutIndex, Rollout: rolloutRef(r),
	}, true, nil
}

// nemoGymGenerations cuts r's tokens into one generation per assistant
// message: the maximal runs of trained positions, in order, each with every
// token before it as its prompt. nil without token ids (chat mode); ok
// false when the runs and the assistant messages do not pair one to one or
// the logprobs are missing.
func nemoGymGenerations(r *Record, after []chatMessage) (gens []NeMoGymTokens, layers, topk int, ok bool, err error) {
	if len(r.Tokens) == 0 {
		return nil, 0, 0, true, nil
	}
	s, err := splitResponse(r)
	if err != nil {
		return nil, 0, 0, false, err
	}
	layers, topk, err = routingShape(r)
	if err != nil {
		return nil, 0, 0, false, err
	}
	if s.logprobs == nil {
		return nil, 0, 0, false, nil
	}
	assistants := 0
	for _, m := range after {
		if m.Role == "assistant" {
			assistants++
		}
	}
	for i := 0; i < len(r.Tokens); {
		if r.LossMask[i] == 0 {
			i++
			continue
		}
		j := i
		for j < len(r.Tokens) && r.LossMask[j] != 0 {
			j++
		}
		gens = append(gens, NeMoGymTokens{
			PromptTokenIDs:     append([]int32{}, r.Tokens[:i]...),
			GenerationTokenIDs: append([]int32{}, r.Tokens[i:j]...),
			GenerationLogProbs: append([]float32{}, r.Logprobs[i:j]...),
		})
		i = j
	}
	if len(gens) != assistants {
		return nil, 0, 0, false, nil
	}
	return gens, layers, topk, true, nil
}

// nemoGymTools converts the OpenAI chat tool definitions to Responses
// function tools.
func nemoGymTools(r *Record) ([]NeMoGymTool, error) {
	tools, err := functionTools(r)
	if err != nil || tools == nil {
		return nil, err
	}
	out := make([]NeMoGymTool, 0, len(tools))
	for _, t := range tools {
		params := t.Function.Parameters
		if len(params) == 0 {
			params = json.RawMessage(`{}`)
		}
		out = append(out, NeMoGymTool{Type: "function", Name: t.Function.Name, Description: t.Function.Description, Parameters: params, Strict: t.Function.Strict})
	}
	return out, nil
}

// WriteNeMoGym writes one NeMoGymRollout per line.
func WriteNeMoGym(out io.Writer, recs []Record, f Filter) (ExportStats, error) {
	lines, st, err := NeMoGymRollouts(recs, f)
	return writeLines(out, "nemo-gym", lines, st, err)
}
