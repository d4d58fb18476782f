package agentloop

import (
	"context"
	"fmt"
	"math"
	"strconv"

	openai "github.com/sashabaranov/go-openai"
)

// StopEnvDone: the environment's responder ended the episode (Feedback.Done).
// It is a model outcome, scored like "finished".
const StopEnvDone StopReason = "env_done"

// StopEnvErr: the environment's responder failed (e.g. its user-simulator
// endpoint was unreachable). A failure of the rollout, never scored.
const StopEnvErr StopReason = "env_error"

// Event kinds of the environment feedback hook.
const (
	// EventEnvMessage: the responder added a message (Message is its
	// index; Detail the responder's note, e.g. the rule that matched).
	EventEnvMessage = "env_message"
	// EventEnvDone: the responder ended the episode after this turn.
	EventEnvDone = "env_done"
	// EventTurnReward: the responder gave this turn a reward (Detail is
	// the value, formatted with strconv 'g').
	EventTurnReward = "turn_reward"
)

// Feedback is an environment's answer to one assistant turn (the record's
// loop_events, turn_rewards and messages hold what it did).
type Feedback struct {
	// Messages are appended to the conversation after the turn (and after
	// its tool results). Role "user" (the default when empty) or
	// "system"; they are context the policy did not produce: in tokens
	// mode the server's template renders them and their ids are masked,
	// exactly like tool results.
	Messages []openai.ChatCompletionMessage
	// Done ends the episode after this turn (stop reason env_done).
	Done bool
	// Reward, when set, is this turn's intermediate reward
	// (Result.TurnRewards). It must be finite.
	Reward *float64
	// Detail is a short note recorded with the events (which rule matched).
	Detail string
}

// Responder is the environment's side of a multi-turn episode (a user
// simulator, a game, a tutor; docs/env-feedback.md). It is declared here,
// where it is consumed, and only here: envs return one per rollout
// (envs.ResponderOf), bound to the rollout's item. Respond is called after
// every assistant turn that did not already end the episode for another
// reason (cut by max_tokens, grace turn), with the whole conversation so
// far (the turn's tool results included); turn is 1-based. An error ends
// the rollout as a failure (StopEnvErr): it means "could not answer", never
// "the model was wrong". Respond is called from the episode's goroutine
// only.
type Responder interface {
	Respond(ctx context.Context, turn int, messages []openai.ChatCompletionMessage) (Feedback, error)
}

// ResponderFunc lets an ordinary function be a Responder.
type ResponderFunc func(ctx context.Context, turn int, messages []openai.ChatCompletionMessage) (Feedback, error)

// Respond implements Responder.
func (f ResponderFunc) Respond(ctx context.Context, turn int, messages []openai.ChatCompletionMessage) (Feedback, error) {
	return f(ctx, turn, messages)
}

// respond runs the responder after a turn. It returns whether the episode
// ended, and whether the responder added messages (the episode goes on
// even after a reply without tool calls).
func (r *runner) respond(ctx, parent context.Context, turn int) (done, added bool) {
	if r.cfg.Responder == nil {
		return false, false
	}
	fb, err := r.cfg.Responder.Respond(ctx, turn+1, cloneMessages(r.res.Messages))
	if err != nil {
		if ctx.Err() != nil {
			r.ctxStop(ctx, parent)
			return true, false
		}
		r.stop(StopEnvErr, fmt.Errorf("rollout %s turn %d: environment responder: %w", r.cfg.ID, turn+1, err))
		return true, false
	}
	if fb.Reward != nil {
		v := *fb.Reward
		if math.IsNaN(v) || math.IsInf(v, 0) {
			r.stop(StopEnvErr, fmt.Errorf("rollout %s turn %d: environment responder gave a turn reward of %v", r.cfg.ID, turn+1, v))
			return true, false
		}
		for len(r.res.TurnRewards) < turn+1 {
			r.res.TurnRewards = append(r.res.TurnRewards, 0)
		}
		r.res.TurnRewards[turn] = v
		r.event(Event{Turn: turn + 1, Kind: EventTurnReward, Message: len(r.res.Messages) - 1, Detail: strconv.FormatFloat(v, 'g', -1, 64)})
	}
	for _, m := range fb.Messages {
		switch m.Role {
		case "":
			m.Role = openai.ChatMessageRoleUser
		case openai.ChatMessageRoleUser, openai.ChatMessageRoleSystem:
		default:
			r.stop(StopEnvErr, fmt.Errorf("rollout %s turn %d: environment responder: message role %q, want user or system", r.cfg.ID, turn+1, m.Role))
			return true, false
		}
		r.res.Messages = append(r.res.Messages, openai.ChatCompletionMessage{Role: m.Role, Content: m.Content})
		r.res.Counters.EnvMessages++
		r.event(Event{Turn: turn + 1, Kind: EventEnvMessage, Message: len(r.res.Messages) - 1, Detail: fb.Detail})
		added = true
	}
	if fb.Done {
		r.event(Event{Turn: turn + 1, Kind: EventEnvDone, Message: len(r.res.Messages) - 1, Detail: fb.Detail})
		r.res.FinishedNaturally = true
		r.stop(StopEnvDone, nil)
		return true, added
	}
	return false, added
}

// padTurnRewards aligns TurnRewards with the turns used once any turn got
// a reward (turns without one read 0).
func (r *runner) padTurnRewards() {
	if len(r.res.TurnRewards) == 0 {
		return
	}
	for len(r.res.TurnRewards) < r.res.TurnsUsed {
		r.res.TurnRewards = append(r.res.TurnRewards, 0)
	}
}
