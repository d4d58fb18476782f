package rewards

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"text/template"
	"time"

	"github.com/rollout-rl/rollout/inference"
)

// DefaultJudgePrompt asks for a JSON verdict. Fields: .Question, .Answer
// (the reference), .Response (the model's final message).
const DefaultJudgePrompt = `You are grading a response against a reference answer.
Question:
{{.Question}}

Reference answer:
{{.Answer}}

Response:
{{.Response}}

Reply with only a JSON object {"score": S, "reason": "..."} where S is a number from 0 (wrong) to 1 (fully correct).`

// Judge asks an OpenAI-compatible chat endpoint to grade the final message.
// The reply must contain a JSON object with a numeric "score" in [0, 1].
// Connection errors, 5xx, rate limits (429, 408) and unreadable verdicts
// are retried; another 4xx or exhausted retries is an ErrReward (never a
// score of 0).
type Judge struct {
	BaseURL  string // e.g. http://127.0.0.1:8000 (with or without /v1)
	Model    string
	APIKey   string
	Prompt   string // text/template; default DefaultJudgePrompt
	Question string // filled per call by the env when it has one
	Retries  int    // default 3
	Timeout  time.Duration
	Client   *http.Client
	tmpl     *template.Template
}

// judgeClient is every judge's client unless Judge.Client is set: the
// inference pool's transport (inference.NewHTTPClient), shared, so that
// the verdicts of many rollouts scored at once reuse kept-alive
// connections instead of dialling one each (net/http's default transport
// keeps two idle per host).
var judgeClient = inference.NewHTTPClient(256)

// NewJudge validates the configuration and parses the prompt template.
func NewJudge(j Judge) (*Judge, error) {
	if j.BaseURL == "" || j.Model == "" {
		return nil, fmt.Errorf("llm_judge: base_url and model are required")
	}
	if j.Prompt == "" {
		j.Prompt = DefaultJudgePrompt
	}
	t, err := template.New("judge").Option("missingkey=error").Parse(j.Prompt)
	if err != nil {
		return nil, fmt.Errorf("llm_judge: prompt template: %w", err)
	}
	j.tmpl = t
	if j.Retries <= 0 {
		j.Retries = 3
	}
	if j.Timeout <= 0 {
		j.Timeout = 2 * time.Minute
	}
	if j.Client == nil {
		j.Client = judgeClient
	}
	return &j, nil
}

var _ Reward = (*Judge)(nil)

type judgeRequest struct {
	Model       string           `json:"model"`
	Messages    []map[string]any `json:"messages"`
	Temperature float64          `json:"temperature"`
	MaxTokens   int              `json:"max_tokens"`
}

type judgeResponse struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
}

// retryable marks failures worth another attempt.
type retryable struct{ error }

// Score implements Reward.
func (j *Judge) Score(ctx context.Context, in Input) (Score, error) {
	var prompt strings.Builder
	if err := j.tmpl.Execute(&prompt, map[string]string{"Question": j.Question, "Answer": in.Answer, "Response": in.Final}); err != nil {
		return Score{}, fmt.Errorf("%w: llm_judge prompt: %w", ErrReward, err)
	}
	body, _ := json.Marshal(judgeRequest{
		Model:       j.Model,
		Messages:    []map[string]any{{"role": "user", "content": prompt.String()}},
		Temperature: 0,
		MaxTokens:   512,
	})
	url := strings.TrimSuffix(j.BaseURL, "/")
	if !strings.HasSuffix(url, "/v1") {
		url += "/v1"
	}
	url += "/chat/completions"
	var last error
	for attempt := range j.Retries {
		if attempt > 0 {
			backoff := time.Duration(200*(1<<attempt))*time.Millisecond + time.Duration(rand.Int64N(int64(100*time.Millisecond)))
			select {
			case <-ctx.Done():
				return Score{}, fmt.Errorf("%w: llm_judge: %w", ErrReward, ctx.Err())
			case <-time.After(backoff):
			}
		}
		score, err := j.once(ctx, url, body)
		if err == nil {
			return score, nil
		}
		last = err
		if _, ok := err.(retryable); !ok {
			break
		}
	}
	return Score{}, fmt.Errorf("%w: llm_judge %s: %w", ErrReward, url, last)
}

func (j *Judge) once(ctx context.Context, url string, body []byte) (Score, error) {
	ctx, cancel := context.WithTimeout(ctx, j.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Score{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if j.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+j.APIKey)
	}
	resp, err := j.Client.Do(req)
	if err != nil {
		return Score{}, retryable{err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return Score{}, retryable{fmt.Errorf("read response: %w", err)}
	}
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout {
		// A 429 or 408 is overload (a hosted judge's rate limit), not a
		// bad request: a verdict is safe to ask for again.
		return Score{}, retryable{fmt.Errorf("HTTP %d: %s", resp.StatusCode, truncate(data))}
	}
	if resp.StatusCode != http.StatusOK {
		return Score{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, truncate(data))
	}
	var r judgeResponse
	if err := json.Unmarshal(data, &r); err != nil || len(r.Choices) == 0 {
		return Score{}, retryable{fmt.Errorf("malformed chat response: %s", truncate(data))}
	}
	v, err := parseVerdict(r.Choices[0].Message.Content)
	if err != nil {
		return Score{}, retryable{err}
	}
	return Score{Value: v, Components: map[string]float64{"judge_score": v}}, nil
}

// parseVerdict finds the last JSON object with a numeric "score" in text.
func parseVerdict(text string) (float64, error) {
	for end := strings.LastIndexByte(text, '}'); end >= 0; end = strings.LastIndexByte(text[:end], '}') {
		for start := strings.LastIndexByte(text[:end], '{'); start >= 0; start = strings.LastIndexByte(text[:start], '{') {
			var v struct {
				Score *float64 `json:"score"`
			}
			if json.Unmarshal([]byte(text[start:end+1]), &v) == nil && v.Score != nil {
				if *v.Score < 0 || *v.Score > 1 {
					return 0, fmt.Errorf("judge score %v outside [0, 1]", *v.Score)
				}
				return *v.Score, nil
			}
		}
	}
	return 0, fmt.Errorf("judge reply has no JSON object with a numeric score: %q", truncate([]byte(text)))
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}
