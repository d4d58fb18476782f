package trajectory

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// EvalOptions configures an eval report.
type EvalOptions struct {
	// ModelName for config_general (default: the records' model).
	ModelName string
	// PassThreshold: a rollout passes when reward >= PassThreshold (1.0).
	PassThreshold *float64
	// Ks for pass@k (default 1 and powers of two up to the largest number
	// of samples per item, plus that number).
	Ks []int
	// GenerationParameters for config_general (default: the first record's
	// sampling params).
	GenerationParameters json.RawMessage
	// Duration overrides total_evaluation_time_seconds (default: the span
	// of the records' start and end times).
	Duration time.Duration
	// EnvMetrics are an env's own evaluation metrics (envs.EvalMetricser),
	// by env name; they join that env's task block "atropos|ENV|0".
	EnvMetrics map[string]map[string]float64
}

// EvalReport is metrics.json: the lighteval-like layout Atropos'
// evaluate_log writes.
type EvalReport struct {
	ConfigGeneral EvalConfig                    `json:"config_general"`
	Results       map[string]map[string]float64 `json:"results"`
}

// EvalConfig is the config_general block.
type EvalConfig struct {
	ModelName                 string          `json:"model_name"`
	TotalEvaluationTimeSecond float64         `json:"total_evaluation_time_seconds"`
	GenerationParameters      json.RawMessage `json:"generation_parameters,omitempty"`
	PassThreshold             float64         `json:"pass_threshold"`
	Ks                        []int           `json:"ks"`
}

// EvalSample is one line of samples.jsonl.
type EvalSample struct {
	Env               string             `json:"env"`
	Category          string             `json:"category,omitempty"`
	ItemID            string             `json:"item_id"`
	GroupID           string             `json:"group_id"`
	RolloutIndex      int32              `json:"rollout_index"`
	Messages          json.RawMessage    `json:"messages"`
	Score             float64            `json:"score"`
	Correct           bool               `json:"correct"`
	RewardComponents  map[string]float64 `json:"reward_components,omitempty"`
	FinishReason      string             `json:"finish_reason"`
	FinishedNaturally bool               `json:"finished_naturally"`
	Status            string             `json:"status"`
	Failure           *Failure           `json:"failure,omitempty"`
	Timings           Timings            `json:"timings"`
}

// MarshalJSON keeps Failure fields lower-case in samples.jsonl.
func (f Failure) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
	}{f.Kind, f.Message})
}

// MarshalJSON writes Timings with snake_case keys.
func (t Timings) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		GenerationMS   int64 `json:"generation_ms"`
		ToolsMS        int64 `json:"tools_ms"`
		SandboxStartMS int64 `json:"sandbox_start_ms"`
		RewardMS       int64 `json:"reward_ms"`
		TotalMS        int64 `json:"total_ms"`
	}(t))
}

// PassAtK is the unbiased pass@k estimator for one item with n samples of
// which c passed: 1 - C(n-c, k) / C(n, k), computed as a product to stay
// exact for large n. It requires k <= n.
func PassAtK(n, c, k int) float64 {
	if n-c < k {
		return 1
	}
	p := 1.0
	for i := n - c + 1; i <= n; i++ {
		p *= 1 - float64(k)/float64(i)
	}
	return 1 - p
}

// ComputeEval builds the report. Infra failures count in
// infra_failure_rate but are excluded from pass@k and rewards: they say
// nothing about the model.
func ComputeEval(recs []Record, opts EvalOptions) EvalReport {
	// A gateway session counts once: its main row.
	recs = MainRows(recs)
	thr := 1.0
	if opts.PassThreshold != nil {
		thr = *opts.PassThreshold
	}
	rep := EvalReport{Results: map[string]map[string]float64{}}
	rep.ConfigGeneral.ModelName = opts.ModelName
	rep.ConfigGeneral.PassThreshold = thr
	rep.ConfigGeneral.GenerationParameters = opts.GenerationParameters
	var first, last time.Time
	maxN := 0
	perItem := map[string]int{}
	for i := range recs {
		r := &recs[i]
		if rep.ConfigGeneral.ModelName == "" {
			rep.ConfigGeneral.ModelName = r.Model
		}
		if rep.ConfigGeneral.GenerationParameters == nil && json.Valid([]byte(r.SamplingParams)) && r.SamplingParams != "" {
			rep.ConfigGeneral.GenerationParameters = json.RawMessage(r.SamplingParams)
		}
		start := r.CreatedAt.Add(-time.Duration(r.Timings.TotalMS) * time.Millisecond)
		if first.IsZero() || start.Before(first) {
			first = start
		}
		if r.CreatedAt.After(last) {
			last = r.CreatedAt
		}
		if r.Status == StatusOK {
			k := r.Env + "\x00" + r.ItemID
			perItem[k]++
			maxN = max(maxN, perItem[k])
		}
	}
	ks := opts.Ks
	if len(ks) == 0 {
		for k := 1; k <= maxN; k *= 2 {
			ks = append(ks, k)
		}
		if maxN > 0 && ks[len(ks)-1] != maxN {
			ks = append(ks, maxN)
		}
	}
	rep.ConfigGeneral.Ks = ks
	if opts.Duration > 0 {
		rep.ConfigGeneral.TotalEvaluationTimeSecond = opts.Duration.Seconds()
	} else if !first.IsZero() {
		rep.ConfigGeneral.TotalEvaluationTimeSecond = last.Sub(first).Seconds()
	}

	type bucket struct {
		name string
		recs []*Record
	}
	buckets := map[string]*bucket{}
	add := func(name string, r *Record) {
		b := buckets[name]
		if b == nil {
			b = &bucket{name: name}
			buckets[name] = b
		}
		b.recs = append(b.recs, r)
	}
	for i := range recs {
		r := &recs[i]
		add("all", r)
		add("atropos|"+r.Env+"|0", r)
		if r.Category != "" {
			add("atropos|"+r.Env+":"+r.Category+"|0", r)
		}
	}
	for name, b := range buckets {
		rep.Results[name] = evalMetrics(b.recs, thr, ks, name == "all" || isTaskKey(name))
	}
	for env, ms := range opts.EnvMetrics {
		block := rep.Results["atropos|"+env+"|0"]
		if block == nil {
			block = map[string]float64{}
			rep.Results["atropos|"+env+"|0"] = block
		}
		for k, v := range ms {
			block[k] = v
		}
	}
	return rep
}

func isTaskKey(name string) bool {
	for i := range len(name) {
		if name[i] == ':' {
			return false
		}
	}
	return true
}

func evalMetrics(recs []*Record, thr float64, ks []int, timings bool) map[string]float64 {
	m := map[string]float64{}
	type item struct{ n, c int }
	items := map[string]*item{}
	var order []string
	var rewards []float64
	failed := 0
	for _, r := range recs {
		if r.Status != StatusOK {
			failed++
			continue
		}
		k := r.Env + "\x00" + r.ItemID
		it := items[k]
		if it == nil {
			it = &item{}
			items[k] = it
			order = append(order, k)
		}
		it.n++
		if r.Reward >= thr {
			it.c++
		}
		rewards = append(rewards, r.Reward)
	}
	m["n_samples"] = float64(len(recs))
	m["n_items"] = float64(len(items))
	m["infra_failures"] = float64(failed)
	if len(recs) > 0 {
		m["infra_failure_rate"] = float64(failed) / float64(len(recs))
	}
	if len(rewards) > 0 {
		sum := 0.0
		for _, x := range rewards {
			sum += x
		}
		mean := sum / float64(len(rewards))
		ss := 0.0
		for _, x := range rewards {
			ss += (x - mean) * (x - mean)
		}
		m["mean_reward"] = mean
		m["std_reward"] = math.Sqrt(ss / float64(len(rewards)))
	}
	for _, k := range ks {
		sum, cnt := 0.0, 0
		for _, key := range order {
			it := items[key]
			if it.n >= k {
				sum += PassAtK(it.n, it.c, k)
				cnt++
			}
		}
		if cnt > 0 {
			m[fmt.Sprintf("pass@%d", k)] = sum / float64(cnt)
		}
	}
	if timings {
		phases := []struct {
			name string
			get  func(*Timings) int64
		}{
			{"total_ms", func(t *Timings) int64 { return t.TotalMS }},
			{"generation_ms", func(t *Timings) int64 { return t.GenerationMS }},
			{"tools_ms", func(t *Timings) int64 { return t.ToolsMS }},
			{"sandbox_start_ms", func(t *Timings) int64 { return t.SandboxStartMS }},
			{"reward_ms", func(t *Timings) int64 { return t.RewardMS }},
		}
		for _, ph := range phases {
			var xs []float64
			for _, r := range recs {
				if r.Status == StatusOK {
					xs = append(xs, float64(ph.get(&r.Timings)))
				}
			}
			if len(xs) == 0 {
				continue
			}
			sort.Float64s(xs)
			for _, p := range []int{50, 90, 99} {
				m[fmt.Sprintf("%s_p%d", ph.name, p)] = percentile(xs, float64(p))
			}
		}
	}
	return m
}

// percentile is the nearest-rank percentile of sorted xs.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// WriteEvalReport writes dir/metrics.json and dir/samples.jsonl (creating
// dir) and returns the report.
func WriteEvalReport(dir string, recs []Record, opts EvalOptions) (*EvalReport, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create eval dir: %w", err)
	}
	recs = MainRows(recs) // a gateway session is one sample
	rep := ComputeEval(recs, opts)
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode metrics.json: %w", err)
	}
	if err := writeFileAtomic(dir, "metrics.json", append(b, '\n')); err != nil {
		return nil, err
	}
	thr := rep.ConfigGeneral.PassThreshold
	sorted := make([]*Record, len(recs))
	for i := range recs {
		sorted[i] = &recs[i]
	}
	sort.SliceStable(sorted, func(a, b int) bool {
		x, y := sorted[a], sorted[b]
		if x.Env != y.Env {
			return x.Env < y.Env
		}
		if x.ItemID != y.ItemID {
			return x.ItemID < y.ItemID
		}
		return x.RolloutIndex < y.RolloutIndex
	})
	tmp := filepath.Join(dir, ".samples.jsonl.tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return nil, fmt.Errorf("create samples.jsonl: %w", err)
	}
	bw := bufio.NewWriter(f)
	for _, r := range sorted {
		msgs := json.RawMessage(r.Messages)
		if !json.Valid(msgs) {
			msgs = json.RawMessage("null")
		}
		s := EvalSample{Env: r.Env, Category: r.Category, ItemID: r.ItemID, GroupID: r.GroupID, RolloutIndex: r.RolloutIndex,
			Messages: msgs, Score: r.Reward, Correct: r.Status == StatusOK && r.Reward >= thr, RewardComponents: r.RewardComponents,
			FinishReason: r.StopReason, FinishedNaturally: r.FinishedNaturally, Status: r.Status, Failure: r.Failure, Timings: r.Timings}
		line, err := marshalNoEscape(s)
		if err == nil {
			_, err = bw.Write(line)
		}
		if err != nil {
			f.Close()
			os.Remove(tmp)
			return nil, fmt.Errorf("write samples.jsonl: %w", err)
		}
	}
	err = bw.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, "samples.jsonl"))
	}
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("write samples.jsonl: %w", err)
	}
	return &rep, nil
}
