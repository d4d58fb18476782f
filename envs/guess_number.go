package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
)

// GuessNumber is a multi-turn game with a verifiable outcome: the env
// thinks of an integer in [min, max]; after each assistant turn it answers
// "higher", "lower" or "correct" (Responder) and the episode ends when the
// model finds it (stop reason env_done). Reward: 1 − turn_penalty per
// extra guess (at least 0) when found within the turn budget, else 0.
// Turn rewards: 1 for the correct guess, −invalid_penalty for a turn
// without a guess in range, 0 otherwise. No sandbox, no tools.
type GuessNumber struct{ cfg guessConfig }

type guessConfig struct {
	Min            int     `yaml:"min" json:"min"`
	Max            int     `yaml:"max" json:"max"`
	MaxTurns       int     `yaml:"max_turns" json:"max_turns"`
	TurnPenalty    float64 `yaml:"turn_penalty" json:"turn_penalty"`
	InvalidPenalty float64 `yaml:"invalid_penalty" json:"invalid_penalty"`
	TrainItems     int     `yaml:"train_items" json:"train_items"`
	EvalItems      int     `yaml:"eval_items" json:"eval_items"`
	Seed           uint64  `yaml:"seed" json:"seed"`
	GroupSize      int     `yaml:"group_size" json:"group_size"`
}

func init() {
	Register("guess-number", func(node *yaml.Node) (Env, error) {
		c := guessConfig{Min: 1, Max: 100, MaxTurns: 10, TurnPenalty: 0.05, InvalidPenalty: 0.1, TrainItems: 200, EvalItems: 50, Seed: 1, GroupSize: 8}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		switch {
		case c.Max <= c.Min:
			return nil, fmt.Errorf("%w: max (%d) must be greater than min (%d)", ErrConfig, c.Max, c.Min)
		case c.MaxTurns <= 0:
			return nil, fmt.Errorf("%w: max_turns must be positive", ErrConfig)
		case c.TurnPenalty < 0 || c.InvalidPenalty < 0 || math.IsNaN(c.TurnPenalty) || math.IsNaN(c.InvalidPenalty):
			return nil, fmt.Errorf("%w: turn_penalty and invalid_penalty must not be negative", ErrConfig)
		case c.TrainItems < 1 || c.EvalItems < 1:
			return nil, fmt.Errorf("%w: train_items and eval_items must be at least 1", ErrConfig)
		case c.GroupSize < 1:
			return nil, fmt.Errorf("%w: group_size must be at least 1", ErrConfig)
		}
		return &GuessNumber{cfg: c}, nil
	})
}

var (
	_ Env        = (*GuessNumber)(nil)
	_ Solver     = (*GuessNumber)(nil)
	_ Responsive = (*GuessNumber)(nil)
)

// Name implements Env.
func (e *GuessNumber) Name() string { return "guess-number" }

// Config implements Configurable.
func (e *GuessNumber) Config() any { return e.cfg }

// Defaults implements Env.
func (e *GuessNumber) Defaults() Defaults {
	return Defaults{
		Description: fmt.Sprintf("Multi-turn game with environment feedback: find an integer in [%d, %d] from higher/lower answers; no sandbox (%d train, %d eval items)", e.cfg.Min, e.cfg.Max, e.cfg.TrainItems, e.cfg.EvalItems),
		GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Splits: []string{"train", "eval"},
	}
}

// Items implements Env: targets drawn from a generator seeded by seed and
// the split, so a split's items never change for one config.
func (e *GuessNumber) Items(_ context.Context, split string) ([]datasets.Item, error) {
	n, salt := e.cfg.TrainItems, uint64(0)
	switch split {
	case "", "train":
		split = "train"
	case "eval":
		n, salt = e.cfg.EvalItems, 1
	default:
		return nil, fmt.Errorf("%w: guess-number has no split %q (train, eval)", datasets.ErrInvalid, split)
	}
	rng := rand.New(rand.NewPCG(e.cfg.Seed, salt))
	rows := make([]datasets.Item, n)
	for i := range rows {
		target := int64(e.cfg.Min + rng.IntN(e.cfg.Max-e.cfg.Min+1))
		id := fmt.Sprintf("guess-%s-%04d", split, i)
		rows[i] = datasets.Item{Data: map[string]any{"id": id, "target": target, "split": split}, Source: "guess-number", Row: i + 1}
	}
	return datasets.Prepare(rows, datasets.Config{})
}

// target reads the item's secret number (any integer-valued JSON number).
func (e *GuessNumber) target(it datasets.Item) (int, error) {
	var v float64
	switch x := it.Data["target"].(type) {
	case int64:
		v = float64(x)
	case int:
		v = float64(x)
	case float64:
		v = x
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return 0, fmt.Errorf("%w: %s row %d: target %q: %v", datasets.ErrInvalid, it.Source, it.Row, x, err)
		}
		v = f
	default:
		return 0, fmt.Errorf("%w: %s row %d: target must be an integer, got %T", datasets.ErrInvalid, it.Source, it.Row, it.Data["target"])
	}
	if v != math.Trunc(v) || v < float64(e.cfg.Min) || v > float64(e.cfg.Max) {
		return 0, fmt.Errorf("%w: %s row %d: target %v is not an integer in [%d, %d]", datasets.ErrInvalid, it.Source, it.Row, v, e.cfg.Min, e.cfg.Max)
	}
	return int(v), nil
}

func (e *GuessNumber) prompt(it datasets.Item) string {
	return fmt.Sprintf("Game %s: I am thinking of an integer between %d and %d. Find it in as few guesses as you can. "+
		"Answer each turn with one integer only; I will tell you whether my number is higher, lower, or correct.", it.ID, e.cfg.Min, e.cfg.Max)
}

// Task implements Env.
func (e *GuessNumber) Task(_ context.Context, it datasets.Item) (Task, error) {
	t, err := e.target(it)
	if err != nil {
		return Task{}, err
	}
	return Task{
		Messages: chat("You are playing a number guessing game. Reply with a single integer each turn.", e.prompt(it)),
		MaxTurns: e.cfg.MaxTurns, Answer: strconv.Itoa(t), Category: "guess-number",
	}, nil
}

var guessRE = regexp.MustCompile(`-?\d+`)

// guess is the last integer of a reply, ok false when there is none.
func guess(text string) (int, bool) {
	all := guessRE.FindAllString(text, -1)
	if len(all) == 0 {
		return 0, false
	}
	g, err := strconv.Atoi(all[len(all)-1])
	return g, err == nil
}

// Responder implements Responsive: the game answers every guess.
func (e *GuessNumber) Responder(it datasets.Item) agentloop.Responder { return forItem(e, it) }

func (e *GuessNumber) respond(_ context.Context, it datasets.Item, _ int, transcript []openai.ChatCompletionMessage) (agentloop.Feedback, error) {
	t, err := e.target(it)
	if err != nil {
		return agentloop.Feedback{}, err
	}
	if toolTurn(transcript) {
		return agentloop.Feedback{}, nil
	}
	reply := func(text, detail string, r float64, done bool) agentloop.Feedback {
		return agentloop.Feedback{Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: text}}, Reward: &r, Done: done, Detail: detail}
	}
	g, ok := guess(lastAssistant(transcript))
	switch {
	case !ok || g < e.cfg.Min || g > e.cfg.Max:
		return reply(fmt.Sprintf("Please answer with one integer between %d and %d.", e.cfg.Min, e.cfg.Max), "invalid", -e.cfg.InvalidPenalty, false), nil
	case g < t:
		return reply("Higher.", "higher", 0, false), nil
	case g > t:
		return reply("Lower.", "lower", 0, false), nil
	}
	return reply(fmt.Sprintf("Correct! The number was %d.", t), "correct", 1, true), nil
}

// Reward implements Env, from the transcript: the first assistant turn
// that named the target.
func (e *GuessNumber) Reward(_ context.Context, it datasets.Item, out Outcome, _ Sandbox) (rewards.Score, error) {
	t, err := e.target(it)
	if err != nil {
		return rewards.Score{}, err
	}
	turn, invalid, found := 0, 0, 0
	for _, m := range out.Messages {
		if m.Role != openai.ChatMessageRoleAssistant {
			continue
		}
		turn++
		g, ok := guess(m.Content)
		if !ok || g < e.cfg.Min || g > e.cfg.Max {
			invalid++
			continue
		}
		if g == t {
			found = turn
			break
		}
	}
	comps := map[string]float64{"solved": 0, "guesses": float64(turn), "invalid_guesses": float64(invalid)}
	if found == 0 {
		return rewards.Score{Value: 0, Components: comps}, nil
	}
	comps["solved"] = 1
	return rewards.Score{Value: max(0, 1-e.cfg.TurnPenalty*float64(found-1)), Components: comps}, nil
}

// Solution implements Solver: the binary search (the steps) and a linear
// scan from min (the wrong path), each reply one guess.
func (e *GuessNumber) Solution(it datasets.Item) (json.RawMessage, bool) {
	t, err := e.target(it)
	if err != nil {
		return nil, false
	}
	type step struct {
		Final string `json:"final"`
	}
	var right, wrong []step
	for lo, hi := e.cfg.Min, e.cfg.Max; lo <= hi; {
		mid := lo + (hi-lo)/2
		right = append(right, step{strconv.Itoa(mid)})
		if mid == t {
			break
		} else if mid < t {
			lo = mid + 1
		} else {
			hi = mid - 1
		}
	}
	for g := e.cfg.Min; g <= t && len(wrong) < e.cfg.MaxTurns; g++ {
		wrong = append(wrong, step{strconv.Itoa(g)})
	}
	b, err := json.Marshal(map[string]any{"steps": right, "wrong": wrong})
	return b, err == nil
}
