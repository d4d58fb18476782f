"""Decoded groups and rollouts: the token columns of either token layout
(docs/api.md, "Token layout") expanded into position-aligned lists, and the
prompt/response split trainers want.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .errors import LayoutError

#: The logprob the server puts on untrained positions (full layout).
LOGPROB_PLACEHOLDER = 1.0


def token_columns(r: Any) -> Tuple[List[int], Optional[List[float]]]:
    """(loss_mask, logprobs) of a ``rollout.v1.Rollout`` message as lists
    aligned with its ``tokens``, from either token layout. ``logprobs`` is
    None when the rollout has none. Raises LayoutError when the fields do
    not add up."""
    n = len(r.tokens)
    if len(r.loss_mask_runs):
        if len(r.loss_mask):
            raise LayoutError("rollout %d: both loss_mask and loss_mask_runs" % r.index)
        runs = list(r.loss_mask_runs)
        if any(k < 0 for k in runs) or sum(runs) != n:
            raise LayoutError("rollout %d: loss_mask_runs %s do not cover its %d tokens" % (r.index, runs, n))
        mask: List[int] = []
        for i, k in enumerate(runs):
            mask.extend([i % 2] * k)
    else:
        mask = list(r.loss_mask)
        if len(mask) != n:
            raise LayoutError("rollout %d: %d loss_mask values for %d tokens" % (r.index, len(mask), n))
    logprobs: Optional[List[float]]
    if len(r.trained_logprobs):
        if len(r.logprobs):
            raise LayoutError("rollout %d: both logprobs and trained_logprobs" % r.index)
        trained = sum(mask)
        if trained != len(r.trained_logprobs):
            raise LayoutError("rollout %d: %d trained_logprobs for %d trained positions"
                              % (r.index, len(r.trained_logprobs), trained))
        it = iter(r.trained_logprobs)
        logprobs = [next(it) if m else LOGPROB_PLACEHOLDER for m in mask]
    elif len(r.logprobs):
        logprobs = list(r.logprobs)
        if len(logprobs) != n:
            raise LayoutError("rollout %d: %d logprobs for %d tokens" % (r.index, len(logprobs), n))
    else:
        logprobs = None
    return mask, logprobs


@dataclass
class Rollout:
    """One rollout of a group, its token columns aligned with ``tokens``.

    ``prompt_ids``/``response_ids`` split ``tokens`` at ``prompt_tokens``
    (the initial prompt); the response holds every later token, tool
    outputs included, which ``response_mask`` (0) keeps out of the loss."""

    index: int
    rollout_id: str
    status: str  # "ok", "infra_failed", ... (docs/trajectory-schema.md)
    failure_kind: str
    failure_message: str
    reward: float
    advantage: Optional[float]
    tokens: List[int]
    loss_mask: List[int]
    logprobs: Optional[List[float]]
    token_versions: List[int]
    prompt_tokens: int
    turns: int
    finished_naturally: bool
    stop_reason: str
    reward_components: Dict[str, float]
    turn_rewards: List[float]
    messages_json: str
    raw: Any = field(repr=False, default=None)

    @classmethod
    def from_proto(cls, r: Any) -> "Rollout":
        mask, logprobs = token_columns(r)
        n = len(r.tokens)
        if r.prompt_tokens < 0 or r.prompt_tokens > n:
            raise LayoutError("rollout %d: prompt_tokens %d outside its %d tokens" % (r.index, r.prompt_tokens, n))
        versions = list(r.token_versions)
        if versions and len(versions) != n:
            raise LayoutError("rollout %d: %d token_versions for %d tokens" % (r.index, len(versions), n))
        return cls(
            index=r.index, rollout_id=r.rollout_id, status=r.status, failure_kind=r.failure_kind,
            failure_message=r.failure_message, reward=r.reward,
            advantage=r.advantage if r.HasField("advantage") else None,
            tokens=list(r.tokens), loss_mask=mask, logprobs=logprobs, token_versions=versions,
            prompt_tokens=r.prompt_tokens, turns=r.turns, finished_naturally=r.finished_naturally,
            stop_reason=r.stop_reason, reward_components=dict(r.reward_components),
            turn_rewards=list(r.turn_rewards), messages_json=r.messages_json, raw=r)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def prompt_ids(self) -> List[int]:
        return self.tokens[:self.prompt_tokens]

    @property
    def response_ids(self) -> List[int]:
        return self.tokens[self.prompt_tokens:]

    @property
    def response_mask(self) -> List[int]:
        return self.loss_mask[self.prompt_tokens:]

    @property
    def trainable_response_mask(self) -> List[int]:
        """``response_mask`` for an ok rollout; all zeros for a failed one
        (an infrastructure failure is no signal about the model: nothing of
        it is trained)."""
        return self.response_mask if self.ok else [0] * len(self.response_ids)

    @property
    def response_logprobs(self) -> Optional[List[float]]:
        """Behaviour logprobs of the response; 0.0 (not the wire's 1.0
        placeholder) where the position is not trained, so a consumer that
        forgets the mask sums nothing."""
        if self.logprobs is None:
            return None
        return [lp if m else 0.0 for lp, m in zip(self.logprobs[self.prompt_tokens:], self.response_mask)]

    @property
    def response_versions(self) -> List[int]:
        return self.token_versions[self.prompt_tokens:]

    def routed_experts(self) -> Optional[List[List[List[int]]]]:
        """The engine's mixture-of-experts routing (routing replay) as
        ``[len(tokens)][layers][topk]``: for each token, the experts it was
        routed to at each layer; zeros at the positions the engine reported
        none for (the last sampled token and what follows it), as verl and
        SkyRL pad. None when the rollout carries no routing."""
        r = self.raw
        if r is None or not len(r.routed_experts_shape):
            return None
        shape = list(r.routed_experts_shape)
        if len(shape) != 3 or min(shape) < 0:
            raise LayoutError("rollout %d: routed_experts_shape %s: want [positions, layers, topk]" % (self.index, shape))
        positions, layers, topk = shape
        flat = r.routed_experts
        if len(flat) != positions * layers * topk:
            raise LayoutError("rollout %d: %d routed experts for shape %s" % (self.index, len(flat), shape))
        if positions > len(self.tokens):
            raise LayoutError("rollout %d: routing for %d positions of %d tokens" % (self.index, positions, len(self.tokens)))
        out = [[list(flat[(p * layers + l) * topk:(p * layers + l + 1) * topk]) for l in range(layers)]
               for p in range(positions)]
        out.extend([[0] * topk for _ in range(layers)] for _ in range(len(self.tokens) - positions))
        return out

    def messages(self) -> List[Dict[str, Any]]:
        """The conversation as chat messages (empty when not recorded)."""
        return json.loads(self.messages_json) if self.messages_json else []


@dataclass
class Group:
    """One scored group (``rollout.v1.Group``) with decoded rollouts."""

    group_id: str
    item_id: str
    request_id: str
    env: str
    mean: float
    std: float
    dropped: bool
    stale: bool
    regenerated: int
    policy_version: Optional[int]
    min_policy_version: Optional[int]
    max_policy_version: Optional[int]
    policy_lag: Optional[int]
    sequence: Optional[int]
    rollouts: List[Rollout]
    raw: Any = field(repr=False, default=None)

    @classmethod
    def from_proto(cls, g: Any) -> "Group":
        def opt(name: str) -> Optional[int]:
            return getattr(g, name) if g.HasField(name) else None

        return cls(
            group_id=g.group_id, item_id=g.item_id, request_id=g.request_id, env=g.env, mean=g.mean, std=g.std,
            dropped=g.dropped, stale=g.stale, regenerated=g.regenerated, policy_version=opt("policy_version"),
            min_policy_version=opt("min_policy_version"), max_policy_version=opt("max_policy_version"),
            policy_lag=opt("policy_lag"), sequence=opt("sequence"),
            rollouts=[Rollout.from_proto(r) for r in g.rollouts], raw=g)

    @property
    def rewards(self) -> List[float]:
        return [r.reward for r in self.rollouts]
