package envs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/internal/util/secrets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/web"
)

// WebResearch: questions answered by searching and reading the web with
// the host-side web_search and web_extract tools (no sandbox: the tools
// never run in one). The provider is configurable; the default is the
// embedded local corpus, so the env runs offline. The reward is an exact
// match of the final "Answer: …" against the reference answer(s), or an
// LLM judge.
type WebResearch struct {
	cfg   webConfig
	tools []tools.Tool
	judge *rewards.Judge
}

type webConfig struct {
	Web          web.Config      `yaml:"web"`
	Dataset      datasets.Config `yaml:"dataset"`
	SystemPrompt string          `yaml:"system_prompt"`
	MaxTurns     int             `yaml:"max_turns"`
	GroupSize    int             `yaml:"group_size"`
	// Reward is exact_match (default) or llm_judge.
	Reward string      `yaml:"reward"`
	Judge  judgeConfig `yaml:"judge"`
}

type judgeConfig struct {
	BaseURL   string        `yaml:"base_url"`
	Model     string        `yaml:"model"`
	APIKeyEnv string        `yaml:"api_key_env"`
	Prompt    string        `yaml:"prompt"`
	Retries   int           `yaml:"retries"`
	Timeout   time.Duration `yaml:"timeout"`
}

const webSystemPrompt = "You answer questions by researching them with the web_search and web_extract tools. " +
	"Search, read the relevant pages, then reply with a final message whose last line is \"Answer: <answer>\", " +
	"the answer as short as possible."

func init() {
	Register("web-research", func(node *yaml.Node) (Env, error) {
		c := webConfig{Web: web.Config{Provider: "corpus"}, SystemPrompt: webSystemPrompt, MaxTurns: 8, GroupSize: 4, Reward: "exact_match"}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		if c.GroupSize < 1 || c.MaxTurns < 1 {
			return nil, fmt.Errorf("%w: group_size and max_turns must be at least 1", ErrConfig)
		}
		var docs []web.Doc
		if c.Web.Provider == "corpus" && c.Web.CorpusPath == "" {
			raw, err := dataFS.ReadFile("data/web_corpus.jsonl")
			if err != nil {
				return nil, err
			}
			if docs, err = web.ParseCorpus(bytes.NewReader(raw), "web_corpus.jsonl"); err != nil {
				return nil, err
			}
		}
		p, err := web.New(c.Web, docs)
		if err != nil {
			return nil, fmt.Errorf("%w: web: %w", ErrConfig, err)
		}
		e := &WebResearch{cfg: c, tools: web.Tools(p, c.Web.MaxResults)}
		switch c.Reward {
		case "exact_match":
		case "llm_judge":
			key := ""
			if c.Judge.APIKeyEnv != "" {
				var err error
				if key, err = secrets.Lookup(c.Judge.APIKeyEnv); err != nil {
					return nil, fmt.Errorf("%w: judge.api_key_env: %w", ErrConfig, err)
				}
			}
			j, err := rewards.NewJudge(rewards.Judge{BaseURL: c.Judge.BaseURL, Model: c.Judge.Model, APIKey: key,
				Prompt: c.Judge.Prompt, Retries: c.Judge.Retries, Timeout: c.Judge.Timeout})
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrConfig, err)
			}
			e.judge = j
		default:
			return nil, fmt.Errorf("%w: reward %q: exact_match or llm_judge", ErrConfig, c.Reward)
		}
		return e, nil
	})
}

var (
	_ Env          = (*WebResearch)(nil)
	_ Solver       = (*WebResearch)(nil)
	_ Configurable = (*WebResearch)(nil)
)

// Name implements Env.
func (e *WebResearch) Name() string { return "web-research" }

// Config implements Configurable.
func (e *WebResearch) Config() any { return e.cfg }

// Defaults implements Env.
func (e *WebResearch) Defaults() Defaults {
	return Defaults{
		Description: "Questions answered with host-side web_search/web_extract (providers: corpus, searxng, json; default: an embedded offline corpus, 8 questions: 6 train, 2 eval); exact-match or LLM-judge reward",
		GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{web.Toolset},
		Splits: []string{"train", "eval"},
	}
}

// Items implements Env: the configured dataset (rows with question and
// answer, optional split), else the embedded questions.
func (e *WebResearch) Items(ctx context.Context, split string) ([]datasets.Item, error) {
	if e.cfg.Dataset.Path == "" {
		return embeddedItems("web_research.jsonl", split)
	}
	rows, err := datasets.Load(ctx, e.cfg.Dataset)
	if err != nil {
		return nil, err
	}
	var out []datasets.Item
	for _, it := range rows {
		if s, ok := it.Data["split"].(string); ok && s != split {
			continue
		}
		out = append(out, it)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: web-research dataset %s has no rows for split %q", datasets.ErrInvalid, e.cfg.Dataset.Path, split)
	}
	return out, nil
}

// Solution implements Solver.
func (e *WebResearch) Solution(it datasets.Item) (json.RawMessage, bool) { return solution(it) }

// Task implements Env.
func (e *WebResearch) Task(_ context.Context, it datasets.Item) (Task, error) {
	q, err := it.String("question")
	if err != nil {
		return Task{}, err
	}
	answers, err := webAnswers(it)
	if err != nil {
		return Task{}, err
	}
	cat, _ := it.String("category")
	return Task{Messages: chat(e.cfg.SystemPrompt, q), Tools: e.tools, Answer: answers[0], Category: cat}, nil
}

// webAnswers are the accepted answers: "answer" (a string or a list).
func webAnswers(it datasets.Item) ([]string, error) {
	v, ok := it.Get("answer")
	if !ok {
		return nil, fmt.Errorf("%w: %s row %d: no answer", datasets.ErrInvalid, it.Source, it.Row)
	}
	var out []string
	switch a := v.(type) {
	case string:
		out = []string{a}
	case []any:
		for _, x := range a {
			if s, ok := x.(string); ok && s != "" {
				out = append(out, s)
			}
		}
	}
	if len(out) == 0 || out[0] == "" {
		return nil, fmt.Errorf("%w: %s row %d: answer must be a non-empty string or list of strings", datasets.ErrInvalid, it.Source, it.Row)
	}
	return out, nil
}

var answerLine = regexp.MustCompile(`(?im)^\s*\**answer\**\s*:\s*(.+?)\s*$`)

// FinalAnswer is the text after the last "Answer:" line of a final
// message, else the whole message.
func FinalAnswer(final string) (string, bool) {
	m := answerLine.FindAllStringSubmatch(final, -1)
	if len(m) == 0 {
		return strings.TrimSpace(final), false
	}
	return m[len(m)-1][1], true
}

// normAnswer lowercases, drops punctuation (keeping digits' inner commas
// and points out: "18,400" = "18400"), articles and extra spaces.
func normAnswer(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		case unicode.IsSpace(r) || r == '-' || r == '/':
			b.WriteByte(' ')
		}
	}
	var words []string
	for _, w := range strings.Fields(b.String()) {
		if w != "a" && w != "an" && w != "the" {
			words = append(words, w)
		}
	}
	return strings.Join(words, " ")
}

// Reward implements Env.
func (e *WebResearch) Reward(ctx context.Context, it datasets.Item, out Outcome, _ Sandbox) (rewards.Score, error) {
	answers, err := webAnswers(it)
	if err != nil {
		return rewards.Score{}, fmt.Errorf("%w: %w", rewards.ErrReward, err)
	}
	got, formatted := FinalAnswer(out.Final)
	comps := map[string]float64{"answer_line": b2f(formatted)}
	if e.judge != nil {
		q, _ := it.String("question")
		j := *e.judge
		j.Question = q
		s, err := j.Score(ctx, rewards.Input{Answer: strings.Join(answers, " / "), Final: out.Final})
		if err != nil {
			return rewards.Score{}, err
		}
		if s.Components == nil {
			s.Components = map[string]float64{}
		}
		s.Components["answer_line"] = comps["answer_line"]
		return s, nil
	}
	ok := false
	for _, a := range answers {
		if normAnswer(a) == normAnswer(got) && normAnswer(a) != "" {
			ok = true
		}
	}
	comps["exact_match"] = b2f(ok)
	return rewards.Score{Value: b2f(ok), Components: comps}, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
