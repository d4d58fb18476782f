"""Groups as ready-to-train arrays.

:func:`to_batch` flattens groups into one row per rollout: prompt ids,
response ids, the response's loss mask, behaviour logprobs and policy
versions, the rollout's reward and advantage. Rows stay ragged lists;
:meth:`Batch.padded` pads them into rectangles (numpy arrays when numpy is
importable, lists of lists otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List

from .types import Group

try:  # numpy is optional: lists when it is missing
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None


def have_numpy() -> bool:
    return _np is not None


@dataclass
class Batch:
    """One row per rollout, in group order. ``advantages`` is the server's
    (docs/config.md, ``advantage``); 0.0 where a rollout has none (failed or
    dropped). ``group_index`` names each row's group in ``group_ids``."""

    prompt_ids: List[List[int]] = field(default_factory=list)
    response_ids: List[List[int]] = field(default_factory=list)
    loss_mask: List[List[int]] = field(default_factory=list)
    logprobs: List[List[float]] = field(default_factory=list)
    versions: List[List[int]] = field(default_factory=list)
    rewards: List[float] = field(default_factory=list)
    advantages: List[float] = field(default_factory=list)
    ok: List[bool] = field(default_factory=list)
    group_index: List[int] = field(default_factory=list)
    group_ids: List[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def padded(self, pad_token_id: int = 0, prompt_side: str = "left") -> Dict[str, Any]:
        """Rectangular arrays: ``prompt_ids`` padded on ``prompt_side``
        (left by default, as causal-LM trainers want), ``response_ids``,
        ``loss_mask``, ``logprobs`` and ``versions`` on the right, with
        ``prompt_attention_mask``/``response_attention_mask`` marking real
        tokens; ``rewards``, ``advantages`` and ``group_index`` as vectors.
        numpy arrays when numpy is importable, lists otherwise."""
        if prompt_side not in ("left", "right"):
            raise ValueError("prompt_side: want 'left' or 'right', got %r" % (prompt_side,))
        out: Dict[str, Any] = {}
        out["prompt_ids"], out["prompt_attention_mask"] = _pad(self.prompt_ids, pad_token_id, prompt_side)
        out["response_ids"], out["response_attention_mask"] = _pad(self.response_ids, pad_token_id, "right")
        out["loss_mask"], _ = _pad(self.loss_mask, 0, "right")
        out["logprobs"], _ = _pad(self.logprobs, 0.0, "right")
        out["versions"], _ = _pad(self.versions, -1, "right")
        out["rewards"], out["advantages"] = list(self.rewards), list(self.advantages)
        out["group_index"] = list(self.group_index)
        if _np is not None:
            types = {"logprobs": _np.float32, "rewards": _np.float64, "advantages": _np.float64}
            out = {k: _np.asarray(v, dtype=types.get(k, _np.int64)) for k, v in out.items()}
        return out


def _pad(rows: List[List[Any]], value: Any, side: str):
    width = max((len(r) for r in rows), default=0)
    data, mask = [], []
    for r in rows:
        gap = width - len(r)
        if side == "left":
            data.append([value] * gap + list(r))
            mask.append([0] * gap + [1] * len(r))
        else:
            data.append(list(r) + [value] * gap)
            mask.append([1] * len(r) + [0] * gap)
    return data, mask


def to_batch(groups: Iterable[Group], include_failed: bool = False) -> Batch:
    """Flattens groups into a Batch. Rollouts whose status is not ``ok``
    (infrastructure failures: no reward to learn from) are left out unless
    ``include_failed``, and then have an all-zero loss mask; dropped groups
    are kept, their advantages are 0."""
    b = Batch()
    for g in groups:
        gi = len(b.group_ids)
        b.group_ids.append(g.group_id)
        for r in g.rollouts:
            if not r.ok and not include_failed:
                continue
            b.prompt_ids.append(r.prompt_ids)
            b.response_ids.append(r.response_ids)
            b.loss_mask.append(r.trainable_response_mask)
            lp = r.response_logprobs
            b.logprobs.append(lp if lp is not None else [0.0] * len(r.response_ids))
            b.versions.append(r.response_versions or [-1] * len(r.response_ids))
            b.rewards.append(r.reward)
            b.advantages.append(r.advantage if r.advantage is not None else 0.0)
            b.ok.append(r.ok)
            b.group_index.append(gi)
    return b


