package trajectory

import (
	"io"
)

// VerlSample is one verl AgentLoopOutput (verl/experimental/agent_loop/
// agent_loop.py) as its agent loop returns it, before the manager pads the
// batch into a DataProto: `AgentLoopOutput(**json.loads(line))` builds it.
// verl keeps no sample file of its own (DataProto.save_to_disk is a
// pickle, _dump_generations writes text), so the export is JSONL.
type VerlSample struct {
	PromptIDs   []int32 `json:"prompt_ids"`
	ResponseIDs []int32 `json:"response_ids"`
	// ResponseMask: 1 for tokens the policy sampled, 0 for tool, env
	// and template tokens.
	ResponseMask []int8 `json:"response_mask"`
	// ResponseLogprobs is aligned to ResponseIDs, 0.0 where untrained;
	// null when the backend returned none.
	ResponseLogprobs []float32 `json:"response_logprobs"`
	// RoutedExperts is [len(prompt_ids)+len(response_ids)][layers][topk]
	// ("for the total tokens"), zeros where the engine reported none;
	// null without routing.
	RoutedExperts [][][]uint16 `json:"routed_experts"`
	RewardScore   float64      `json:"reward_score"`
	// NumTurns counts as verl's tool agent loop does: user turns (a run
	// of tool results or an env/user message) + assistant turns + 1.
	NumTurns    int             `json:"num_turns"`
	Metrics     VerlMetrics     `json:"metrics"`
	ExtraFields VerlExtraFields `json:"extra_fields"`
}

// VerlMetrics is verl's AgentLoopMetrics: seconds spent generating and in
// tool calls; num_preempted -1 (not available).
type VerlMetrics struct {
	GenerateSequences float64 `json:"generate_sequences"`
	ToolCalls         float64 `json:"tool_calls"`
	NumPreempted      int     `json:"num_preempted"`
}

// VerlExtraFields are the sample's extra_fields: reward_extra_info (the
// reward components, which verl's manager turns into batch columns),
// param_version_start/end (the policy versions of the sampled tokens, as
// verl's fully asynchronous agent loops record them) and the rollout facts.
type VerlExtraFields struct {
	RewardExtraInfo   map[string]float64 `json:"reward_extra_info"`
	ParamVersionStart *int64             `json:"param_version_start,omitempty"`
	ParamVersionEnd   *int64             `json:"param_version_end,omitempty"`
	Rollout           RolloutRef         `json:"rollout"`
}

// VerlSamples builds one sample per selected record: every branch of a
// gateway session is its own sample with the session's reward. Infra
// failures and rows that generated nothing are never samples; a record
// without token ids is refused (ErrNoTokens).
func VerlSamples(recs []Record, f Filter) ([]VerlSample, ExportStats, error) {
	sel, st := trainableRecords(recs, f)
	var out []VerlSample
	for _, g := range groupRecords(sel) {
		for _, r := range g {
			s, err := splitResponse(r)
			if err != nil {
				return nil, st, err
			}
			layers, topk, err := routingShape(r)
			if err != nil {
				return nil, st, err
			}
			turns, err := verlTurns(r)
			if err != nil {
				return nil, st, err
			}
			v := VerlSample{
				PromptIDs: s.prompt, ResponseIDs: s.response, ResponseMask: s.mask, ResponseLogprobs: s.logprobs,
				RewardScore: r.Reward, NumTurns: turns,
				Metrics: VerlMetrics{GenerateSequences: float64(r.Timings.GenerationMS) / 1000, ToolCalls: float64(r.Timings.ToolsMS) / 1000, NumPreempted: -1},
				ExtraFields: VerlExtraFields{RewardExtraInfo: r.RewardComponents, ParamVersionStart: r.MinPolicyVersion,
					ParamVersionEnd: r.MaxPolicyVersion, Rollout: rolloutRef(r)},
			}
			if v.ExtraFields.RewardExtraInfo == nil {
				v.ExtraFields.RewardExtraInfo = map[string]float64{}
			}
			if layers > 0 {
				v.RoutedExperts = expertsRows(r, len(r.Tokens), layers, topk)
			}
			out = append(out, v)
			st.Written++
		}
	}
	return out, st, nil
}

// verlTurns counts the conversation's turns the way verl's tool agent loop
// does (user_turns + assistant_turns + 1): each assistant message, each run
// of tool results and each user message after the prompt is a turn, the
// prompt one more.
func verlTurns(r *Record) (int, error) {
	msgs, err := parseMessages(r)
	if err != nil {
		return 0, err
	}
	turns, inPrompt := 1, true
	for i, m := range msgs {
		if m.Role == "assistant" {
			inPrompt = false
		}
		switch {
		case inPrompt:
		case m.Role == "assistant":
			turns++
		case m.Role == "tool":
			if msgs[i-1].Role != "tool" {
				turns++
			}
		default:
			turns++
		}
	}
	return turns, nil
}

// WriteVerl writes one VerlSample per line.
func WriteVerl(out io.Writer, recs []Record, f Filter) (ExportStats, error) {
	samples, st, err := VerlSamples(recs, f)
	return writeLines(out, "verl", samples, st, err)
}
