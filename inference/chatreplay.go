package inference

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	openai "github.com/sashabaranov/go-openai"
)

// Chat mode against llama.cpp has two turns it cannot return as they are:
//
//   - HTTP 500 "The model produced output that does not match the expected
//     peg-native format": the model's text after a tool-call opener did not
//     parse with the tool-call parser the server derived from the template.
//     It is the model's output, not a server failure, but the server
//     returns no text.
//   - An answer whose logprob entries name fewer ids than it generated:
//     llama.cpp gives no entry to a token that ends inside a UTF-8
//     character.
//
// Every chat request to llama.cpp carries an explicit seed (chatSeed). The
// turn is replayed on /completion with the same prompt ids (the server's
// own render, /apply-template + /tokenize), the same sampler and the same
// seed: llama.cpp samples the same ids (measured on the real-engine image:
// the ids a chat answer names are, in order, the replay's ids, and the
// counts agree). The replay returns every id and the raw text. A replay of
// an answer with named ids is checked against them; when none reproduces
// them (llama.cpp's logits depend on batching and caching), the replay —
// a sample of the policy at the same seed, taken whatever its text — is
// the turn (ReplayReplaced).

// ErrServerParse marks the llama.cpp 500 whose cause is the model's own
// tool-call text (serverParseMessage). Comes with ErrRequest: never
// retried by the pool, never held against the endpoint.
var ErrServerParse = errors.New("the server could not parse the model's tool-call text")

// serverParseMessage recognises llama.cpp's HTTP 500 for model output its
// template-derived tool-call parser cannot read ("The model produced
// output that does not match the expected peg-native format"; the format
// name varies with the template).
func serverParseMessage(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "does not match the expected") && strings.Contains(m, "format")
}

func serverParseFailure(err error) bool { return errors.Is(err, ErrServerParse) }

// chatSeed is the seed of one chat turn: distinct per rollout and turn (a
// GRPO group's rollouts differ), the same for every attempt of the same
// request, and mixed with the configured seed when there is one. llama.cpp
// takes a uint32 and reads 0xFFFFFFFF as "random", so the value stays below
// 2^31.
func chatSeed(id string, turn int, configured *int64) int64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(turn)))
	if configured != nil {
		h.Write([]byte{0})
		h.Write([]byte(strconv.FormatInt(*configured, 10)))
	}
	return int64(h.Sum64() & 0x7fffffff)
}

// namedTurn is a chat answer whose logprob entries named only some ids.
type namedTurn struct {
	ch  ChatChoice
	ids []int32 // the named ids, in order
	n   int     // usage.completion_tokens
	ep  string
}

// replayTurn replays turn turnNo of req on /completion (see above). named
// is the chat answer when it came back with ids missing (the replay must
// agree with it); nil after the parse-failure 500, whose error is cause.
func (e *chatEpisode) replayTurn(ctx context.Context, messages []openai.ChatCompletionMessage, req *ChatRequest, turnNo int, reqID string, named *namedTurn, cause error) (Turn, error) {
	const op = "replay on POST /completion"
	s := e.spec.Sampling
	s.Seed = req.Seed
	o := CallOptions{Affinity: &e.aff, RequestID: reqID + "-replay"}
	prompt, err := e.c.promptIDsFallback(ctx, o, messages, req.ToolsJSON, s.ChatTemplateKwargs)
	if err != nil {
		return Turn{}, fmt.Errorf("episode %s turn %d: %s: prompt: %w (after %w)", e.spec.ID, turnNo, op, err, orNamed(cause, named))
	}
	maxTokens := s.MaxTokens
	if maxTokens <= 0 {
		maxTokens = -1 // llama.cpp: until the end of the context, as the chat route
	}
	smp, version, attempt, replaced, err := e.replaySample(ctx, genInput{model: e.spec.Model, prompt: prompt, maxTokens: maxTokens, s: s, opts: o}, named, reqID, req.Seed)
	if err != nil {
		return Turn{}, fmt.Errorf("episode %s turn %d: %s: %w (after %w)", e.spec.ID, turnNo, op, err, orNamed(cause, named))
	}
	text, err := e.c.pool.Detokenize(ctx, o, e.spec.Model, smp.ids)
	if err != nil {
		return Turn{}, fmt.Errorf("episode %s turn %d: %s: detokenize: %w", e.spec.ID, turnNo, op, err)
	}
	t := Turn{Parsed: true, Text: text, Content: text, FinishReason: smp.finish, Endpoint: smp.endpoint, Version: version}
	if named != nil && !replaced {
		// The chat answer stands (its parsed content and calls); only its
		// ids come from the replay.
		ch := named.ch
		t.Content, t.Text = "", ""
		if ch.Message.Content != nil {
			t.Content, t.Text = *ch.Message.Content, *ch.Message.Content
		}
		t.Reasoning, t.ToolCalls, t.FinishReason = ch.Message.ReasoningText(), ch.Message.ToolCalls, ch.FinishReason
	} else {
		// The server's parser refused the text: the loop gets it raw as
		// content (its configured parser reads calls left in content) and
		// a text the template renders back as it is.
		// (Or no replay reproduced the chat answer's ids: the replay
		// replaces it.)
	}
	reason := ReplayIDs
	switch {
	case named == nil:
		reason = ReplayServerParse
		t.Replay = ReplayServerParse
	case replaced:
		reason = ReplayReplaced
		t.Replay = ReplayReplaced
	default:
		t.Replay = ReplayIDs
	}
	e.c.log.Info(replayLogMsg, "request", reqID, "reason", reason, "seed", *req.Seed, "tokens", len(smp.ids), "replays", attempt)
	if e.c.cfg.ChatTokenIDs {
		t.CompletionIDs, t.Logprobs = smp.ids, smp.logprobs
	}
	t.PromptTokens, t.CompletionTokens = len(prompt), len(smp.ids)
	if em := e.c.pool.metricsFor(smp.endpoint); em != nil {
		em.tokensIn.Add(float64(t.PromptTokens))
		em.tokensOut.Add(float64(t.CompletionTokens))
	}
	e.known = t.PromptTokens + t.CompletionTokens
	if e.c.cfg.ChatTokenIDs {
		e.splice(prompt, smp.ids, smp.logprobs, smp.unscored, version)
	}
	e.turns = turnNo
	return t, nil
}

// replaySample samples the turn again on /completion at its seed, under
// the update gate. With named (the chat answer whose ids are wanted) it
// replays until the sample is that generation, up to replayAttempts; if
// none is, the last replay replaces the answer (replaced). attempts counts
// the replays.
func (e *chatEpisode) replaySample(ctx context.Context, in genInput, named *namedTurn, reqID string, seed *int64) (smp sample, version int64, attempt int, replaced bool, err error) {
	attempt = 1
	for ; ; attempt++ {
		tk, err := e.c.gate.enter(ctx)
		if err != nil {
			return smp, 0, attempt, false, err
		}
		gctx, sink := withVersionSink(ctx)
		smp, err = llamaGen{}.generate(gctx, e.c.pool, in)
		if err == nil {
			ev, evOK := sink.get()
			version, _, _ = e.c.stamp(tk, ev, evOK)
		}
		e.c.gate.exit()
		if err != nil {
			return smp, 0, attempt, false, err
		}
		if named == nil {
			break
		}
		msg := sameGeneration(named, smp)
		if msg == "" {
			break
		}
		// llama.cpp's logits depend slightly on how a position was
		// batched with other requests, so a seeded draw close to a
		// boundary can flip. Another replay of the same request is
		// accepted only if it is the chat answer's generation: the turn
		// itself is never resampled.
		if attempt == replayAttempts {
			// The chat answer's ids cannot be had. The replay is itself
			// a sample of the policy at the same seed, taken whatever its
			// text (never chosen for a property of it), with every id and
			// its logprob: it becomes the turn, raw, as after a server
			// parse failure.
			e.c.log.Debug("inference: replays of a chat turn differ from the answer; the last replay is the turn", "request", reqID, "seed", *seed, "diff", msg)
			replaced = true
			break
		}
		e.c.log.Debug("inference: replay of a chat turn differs from the answer; replaying again", "request", reqID, "seed", *seed, "attempt", attempt, "diff", msg)
	}
	return smp, version, attempt, replaced, nil
}

// The log line of a replayed chat turn; its reason is Turn.Replay.
const replayLogMsg = "inference: chat turn replayed on /completion at its seed"

// Turn.Replay values: why a chat turn against llama.cpp was replayed on
// /completion at its seed.
const (
	// ReplayServerParse: llama.cpp refused the model's tool-call text
	// (HTTP 500); the turn is the replay's raw text.
	ReplayServerParse = "server_parse_failed"
	// ReplayIDs: the answer named only some ids; the replay reproduced
	// them, and the turn is the chat answer with the replay's ids.
	ReplayIDs = "ids_missing"
	// ReplayReplaced: the answer named only some ids and no replay
	// reproduced them; the turn is the last replay's raw text.
	ReplayReplaced = "ids_missing_replaced"
)

// replayAttempts bounds the replays of a chat answer whose ids are missing.
const replayAttempts = 2

func orNamed(cause error, named *namedTurn) error {
	if cause != nil {
		return cause
	}
	return fmt.Errorf("a chat answer naming %d of its %d completion tokens", len(named.ids), named.n)
}

// sameGeneration checks a replay against the chat answer: as many ids as
// the answer's usage counts, the named ids in order among them (a missing
// entry only ever drops an id), the same finish. It returns what differs,
// "" when nothing does.
func sameGeneration(named *namedTurn, smp sample) string {
	if len(smp.ids) != named.n {
		return fmt.Sprintf("generated %d tokens", len(smp.ids))
	}
	i := 0
	for _, id := range smp.ids {
		if i < len(named.ids) && named.ids[i] == id {
			i++
		}
	}
	if i != len(named.ids) {
		return fmt.Sprintf("does not contain the named ids in order (%d of %d matched)", i, len(named.ids))
	}
	if (smp.finish == "length") != (named.ch.FinishReason == "length") {
		return fmt.Sprintf("finished with %q, the answer with %q", smp.finish, named.ch.FinishReason)
	}
	return ""
}
