package trajectory

import (
	"io"
)

// SkyRLGroup is one group as a SkyRL GeneratorOutput (skyrl/train/
// generators/base.py), the batch a GeneratorInterface.generate returns:
// `GeneratorOutput(**json.loads(line))`. One line per group, so a line is
// a GRPO group; trajectories are in rollout order, a gateway session's
// branches after their branch 0.
type SkyRLGroup struct {
	PromptTokenIDs [][]int32 `json:"prompt_token_ids"`
	ResponseIDs    [][]int32 `json:"response_ids"`
	// Rewards are the trajectories' scalar rewards (SkyRL places a scalar
	// on the last response token itself).
	Rewards   []float64 `json:"rewards"`
	LossMasks [][]int8  `json:"loss_masks"`
	// StopReasons are rollout's stop reasons; "length" (max_tokens hit) is
	// the value SkyRL's overlong filtering keys on.
	StopReasons    []string       `json:"stop_reasons"`
	RolloutMetrics map[string]any `json:"rollout_metrics"`
	// RolloutLogprobs are aligned to ResponseIDs, 0.0 on untrained
	// positions; null unless every trajectory of the group has them.
	RolloutLogprobs [][]float32   `json:"rollout_logprobs"`
	TrajectoryIDs   []SkyRLTrajID `json:"trajectory_ids"`
	// TrajectoryGenerationTimes are each trajectory's wall-clock seconds;
	// TrajectoryTimeSplits splits them into "llm" (generation) and "env"
	// (tool) seconds.
	TrajectoryGenerationTimes []float64            `json:"trajectory_generation_times"`
	TrajectoryTimeSplits      map[string][]float64 `json:"trajectory_time_splits"`
	// RolloutExpertIndices is [trajectory][len(prompt)+len(response)]
	// [layers][topk], zeros where the engine reported none; null without
	// routing.
	RolloutExpertIndices [][][][]uint16 `json:"rollout_expert_indices"`
	// IsLastStep is null: the export writes whole trajectories, not
	// SkyRL's step-wise samples.
	IsLastStep []bool `json:"is_last_step"`
	// EnvMetrics are per trajectory: the reward components.
	EnvMetrics []map[string]float64 `json:"env_metrics"`
	// Rollout is not a GeneratorOutput key: the rollout facts per
	// trajectory (advantage, policy versions, session and branch).
	Rollout []RolloutRef `json:"rollout"`
}

// SkyRLTrajID is SkyRL's TrajectoryID: instance_id groups the samples of
// one prompt (rollout's group id), repetition_id is the rollout's index.
type SkyRLTrajID struct {
	InstanceID   string `json:"instance_id"`
	RepetitionID int32  `json:"repetition_id"`
}

// SkyRLGroups builds one GeneratorOutput per group from the selected
// records (filters and refusals as VerlSamples).
func SkyRLGroups(recs []Record, f Filter) ([]SkyRLGroup, ExportStats, error) {
	sel, st := trainableRecords(recs, f)
	var out []SkyRLGroup
	for _, g := range groupRecords(sel) {
		sg := SkyRLGroup{TrajectoryTimeSplits: map[string][]float64{}}
		allLogprobs := true
		for _, r := range g {
			s, err := splitResponse(r)
			if err != nil {
				return nil, st, err
			}
			sg.PromptTokenIDs = append(sg.PromptTokenIDs, s.prompt)
			sg.ResponseIDs = append(sg.ResponseIDs, s.response)
			sg.LossMasks = append(sg.LossMasks, s.mask)
			sg.Rewards = append(sg.Rewards, r.Reward)
			sg.StopReasons = append(sg.StopReasons, r.StopReason)
			sg.RolloutLogprobs = append(sg.RolloutLogprobs, s.logprobs)
			allLogprobs = allLogprobs && s.logprobs != nil
			sg.TrajectoryIDs = append(sg.TrajectoryIDs, SkyRLTrajID{InstanceID: r.GroupID, RepetitionID: r.RolloutIndex})
			sg.TrajectoryGenerationTimes = append(sg.TrajectoryGenerationTimes, float64(r.Timings.TotalMS)/1000)
			sg.TrajectoryTimeSplits["llm"] = append(sg.TrajectoryTimeSplits["llm"], float64(r.Timings.GenerationMS)/1000)
			sg.TrajectoryTimeSplits["env"] = append(sg.TrajectoryTimeSplits["env"], float64(r.Timings.ToolsMS)/1000)
			comp := r.RewardComponents
			if comp == nil {
				comp = map[string]float64{}
			}
			sg.EnvMetrics = append(sg.EnvMetrics, comp)
			sg.Rollout = append(sg.Rollout, rolloutRef(r))
		}
		if !allLogprobs {
			sg.RolloutLogprobs = nil
		}
		experts, err := groupExperts(g)
		if err != nil {
			return nil, st, err
		}
		sg.RolloutExpertIndices = experts
		out = append(out, sg)
		st.Written++
	}
	return out, st, nil
}

// WriteSkyRL writes one SkyRLGroup per line.
func WriteSkyRL(out io.Writer, recs []Record, f Filter) (ExportStats, error) {
	groups, st, err := SkyRLGroups(recs, f)
	return writeLines(out, "skyrl", groups, st, err)
}
