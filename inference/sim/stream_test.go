package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

type streamChunk struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	PromptTokenIDs []int  `json:"prompt_token_ids"`
	Choices        []struct {
		Index int `json:"index"`
		Delta struct {
			Role      *string `json:"role"`
			Content   *string `json:"content"`
			Reasoning *string `json:"reasoning"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Logprobs *struct {
			Content []struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"content"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
		TokenIDs     []int   `json:"token_ids"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// readSSE returns the data payloads of an event stream.
func readSSE(t *testing.T, url, body string) []string {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		out = append(out, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestChatStreamMatchesNonStream(t *testing.T) {
	for _, fam := range []string{"hermes", "qwen3_coder", "kimi_k2", "llama3_json"} {
		t.Run(fam, func(t *testing.T) {
			srv := startSim(t, Config{Family: fam, Reasoning: true, Scripts: []Script{fixScript}})
			base := `"messages":[{"role":"user","content":"fix the bug ✓"}],"tools":[` + terminalTool + `,` + readFileTool + `],"seed":9,"return_token_ids":true,"logprobs":true`
			_, b := post(t, srv.URL+"/v1/chat/completions", `{`+base+`}`)
			want := decode[chatResp](t, b)
			events := readSSE(t, srv.URL+"/v1/chat/completions", `{`+base+`,"stream":true,"stream_options":{"include_usage":true}}`)
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", events[len(events)-1])
			}
			var ids []int
			var reasoning, content strings.Builder
			var finish string
			var calls []string
			var usage bool
			for i, ev := range events[:len(events)-1] {
				c := decode[streamChunk](t, []byte(ev))
				if c.Object != "chat.completion.chunk" || !strings.HasPrefix(c.ID, "chatcmpl-") {
					t.Fatalf("chunk %d header: %s", i, ev)
				}
				if i == 0 {
					if len(c.PromptTokenIDs) == 0 || c.Choices[0].Delta.Role == nil {
						t.Fatalf("first chunk must carry the role and prompt_token_ids: %s", ev)
					}
					continue
				}
				if c.PromptTokenIDs != nil {
					t.Fatalf("prompt_token_ids after the first chunk: %s", ev)
				}
				if c.Usage != nil {
					usage = len(c.Choices) == 0 && c.Usage.CompletionTokens == len(want.Choices[0].TokenIDs)
					continue
				}
				ch := c.Choices[0]
				if len(ch.TokenIDs) != 1 || ch.Logprobs == nil || len(ch.Logprobs.Content) != 1 {
					t.Fatalf("token chunk %d must carry one id and one logprob: %s", i, ev)
				}
				ids = append(ids, ch.TokenIDs...)
				if ch.Delta.Reasoning != nil {
					reasoning.WriteString(*ch.Delta.Reasoning)
				}
				if ch.Delta.Content != nil {
					content.WriteString(*ch.Delta.Content)
				}
				for _, tc := range ch.Delta.ToolCalls {
					calls = append(calls, tc.Function.Name+" "+tc.Function.Arguments)
				}
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
			}
			w := want.Choices[0]
			if !slices.Equal(ids, w.TokenIDs) {
				t.Errorf("streamed ids differ:\n%v\n%v", ids, w.TokenIDs)
			}
			if reasoning.String() != deref(w.Message.Reasoning) {
				t.Errorf("reasoning %q, want %q", reasoning.String(), deref(w.Message.Reasoning))
			}
			if wc := w.Message.Content; (wc == nil && content.Len() > 0) || (wc != nil && content.String() != *wc) {
				t.Errorf("content %q, want %q", content.String(), deref(wc))
			}
			var wantCalls []string
			for _, tc := range w.Message.ToolCalls {
				wantCalls = append(wantCalls, tc.Function.Name+" "+tc.Function.Arguments)
			}
			if !slices.Equal(calls, wantCalls) || finish != w.FinishReason {
				t.Errorf("calls %v finish %q, want %v %q", calls, finish, wantCalls, w.FinishReason)
			}
			if !usage {
				t.Error("missing or wrong usage chunk")
			}
		})
	}
}

func TestChatStreamPlain(t *testing.T) {
	srv := startSim(t, Config{})
	events := readSSE(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`)
	var content strings.Builder
	for _, ev := range events[1 : len(events)-1] {
		c := decode[streamChunk](t, []byte(ev))
		if c.Choices[0].TokenIDs != nil {
			t.Fatalf("token_ids without return_token_ids: %s", ev)
		}
		if d := c.Choices[0].Delta.Content; d != nil {
			content.WriteString(*d)
		}
	}
	if content.String() != "Hello! I am the rollout simulator." {
		t.Fatalf("content %q", content.String())
	}
	var last streamChunk
	if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil || last.Choices[0].FinishReason == nil || *last.Choices[0].FinishReason != "stop" {
		t.Fatalf("last chunk must carry finish_reason stop: %s", events[len(events)-2])
	}
}

func TestCompletionsStream(t *testing.T) {
	srv := startSim(t, Config{Scripts: []Script{{Match: "unicode", Steps: []Step{{Final: "naïve ✓ café"}}}}})
	prompt := `"<|im_start|>user\nunicode please<|im_end|>\n<|im_start|>assistant\n"`
	base := `"prompt":` + prompt + `,"max_tokens":100,"logprobs":1,"return_token_ids":true,"seed":4`
	_, b := post(t, srv.URL+"/v1/completions", `{`+base+`}`)
	var want struct {
		Choices []struct {
			Text           string `json:"text"`
			TokenIDs       []int  `json:"token_ids"`
			PromptTokenIDs []int  `json:"prompt_token_ids"`
			FinishReason   string `json:"finish_reason"`
		}
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	events := readSSE(t, srv.URL+"/v1/completions", `{`+base+`,"stream":true,"stream_options":{"include_usage":true}}`)
	var text strings.Builder
	var ids []int
	var finish string
	for i, ev := range events[:len(events)-2] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Text           string  `json:"text"`
				TokenIDs       []int   `json:"token_ids"`
				PromptTokenIDs []int   `json:"prompt_token_ids"`
				FinishReason   *string `json:"finish_reason"`
				Logprobs       struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		ch := c.Choices[0]
		if c.Object != "text_completion" || len(ch.TokenIDs) != 1 || len(ch.Logprobs.Tokens) != 1 {
			t.Fatalf("event %d: %s", i, ev)
		}
		if (i == 0) != (ch.PromptTokenIDs != nil) {
			t.Fatalf("prompt_token_ids must come with the first event only: %s", ev)
		}
		if !utf8.ValidString(ch.Text) {
			t.Fatalf("event %d splits a character: %q", i, ch.Text)
		}
		text.WriteString(ch.Text)
		ids = append(ids, ch.TokenIDs...)
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
	}
	w := want.Choices[0]
	if text.String() != w.Text || !slices.Equal(ids, w.TokenIDs) || finish != w.FinishReason {
		t.Fatalf("stream %q %v %q, want %q %v %q", text.String(), ids, finish, w.Text, w.TokenIDs, w.FinishReason)
	}
	if !strings.Contains(events[len(events)-2], `"usage"`) || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream tail: %v", events[len(events)-2:])
	}
}

func TestGenerateStream(t *testing.T) {
	srv := startSim(t, Config{Reasoning: true})
	body := `"token_ids":[257,117,115,101,114,10,104,105,258,10,257,97,115,115,105,115,116,97,110,116,10],"sampling_params":{"logprobs":0,"seed":2}`
	_, b := post(t, srv.URL+"/inference/v1/generate", `{`+body+`}`)
	var want struct {
		Choices []struct {
			TokenIDs     []int  `json:"token_ids"`
			FinishReason string `json:"finish_reason"`
		}
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	events := readSSE(t, srv.URL+"/inference/v1/generate", `{`+body+`,"request_id":"abc","stream":true,"stream_options":{"include_usage":true}}`)
	var ids []int
	var finish string
	for _, ev := range events[:len(events)-2] {
		var c struct {
			RequestID string `json:"request_id"`
			Choices   []struct {
				TokenIDs     []int   `json:"token_ids"`
				FinishReason *string `json:"finish_reason"`
				Logprobs     struct {
					Content []struct {
						Token string `json:"token"`
					} `json:"content"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		if c.RequestID != "generate-tokens-abc" || len(c.Choices[0].Logprobs.Content) != 1 || !strings.HasPrefix(c.Choices[0].Logprobs.Content[0].Token, "token_id:") {
			t.Fatalf("event: %s", ev)
		}
		ids = append(ids, c.Choices[0].TokenIDs...)
		if f := c.Choices[0].FinishReason; f != nil {
			finish = *f
		}
	}
	if !slices.Equal(ids, want.Choices[0].TokenIDs) || finish != want.Choices[0].FinishReason {
		t.Fatalf("streamed %v %q, want %v %q", ids, finish, want.Choices[0].TokenIDs, want.Choices[0].FinishReason)
	}
	if !strings.Contains(events[len(events)-2], `"usage"`) {
		t.Fatalf("no usage event: %s", events[len(events)-2])
	}
}

func TestCompleteUTF8(t *testing.T) {
	for s, want := range map[string]int{"": 0, "abc": 3, "a\xc3": 1, "a\xc3\xa9": 3, "\xe2\x9c": 0, "\xe2\x9c\x93": 3, "x\xf0\x9f\x98": 1} {
		if got := completeUTF8(s); got != want {
			t.Errorf("completeUTF8(%q) = %d, want %d", s, got, want)
		}
	}
}
