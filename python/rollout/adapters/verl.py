"""verl adapter (volcengine/verl at b178a3c; docs/trainers/verl.md).

:class:`RolloutAgentLoopManager` stands where verl's ``AgentLoopManager``
does (``verl/experimental/agent_loop/agent_loop.py``):
``generate_sequences(batch)`` takes the trainer's batch, already repeated
``rollout.n`` times in a row (``batch.repeat(interleave=True)``) with one
``uid`` per prompt, collects one rollout group per prompt and returns

- :meth:`run`: per sample an :class:`AgentLoopOutput`-shaped dict
  (``prompt_ids``, ``response_ids``, ``response_mask``,
  ``response_logprobs``, ``reward_score``, ``num_turns``, ``metrics``,
  ``extra_fields``), and
- :meth:`generate_sequences`: the padded batch verl's ``_postprocess``
  builds from them (``prompts``, ``responses``, ``response_mask``,
  ``input_ids``, ``attention_mask``, ``position_ids``, ``rollout_log_probs``,
  ``rm_scores``; ``__num_turns__`` and extra fields as non-tensor columns),
  as a ``DataProto`` when verl is importable, else as a dict of numpy
  arrays (lists without numpy).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ..batch import _np
from ..client import Client
from ._common import (AdapterError, ItemCollector, default_to_item, group_routing, runs_by_key, sampling_overrides,
                      split_runs)


def default_verl_item(row: Dict[str, Any]) -> Dict[str, Any]:
    """The row's ``rollout_item`` column (a dict or JSON text, e.g. put
    there by the dataset's preprocessing) is the env item; or
    ``extra_info["rollout_item"]``. Pass ``to_item`` for anything else."""
    if "rollout_item" in row:
        return default_to_item(row["rollout_item"])
    extra = row.get("extra_info")
    if isinstance(extra, dict) and "rollout_item" in extra:
        return default_to_item(extra["rollout_item"])
    raise AdapterError("verl batch row has no rollout_item column (nor extra_info.rollout_item): pass "
                       "to_item=(row) -> item")


def _rows(batch: Any) -> List[Dict[str, Any]]:
    nt = getattr(batch, "non_tensor_batch", None)
    if nt is None and isinstance(batch, dict):
        nt = batch.get("non_tensor_batch", batch)
    if not nt:
        raise AdapterError("generate_sequences: the batch has no non_tensor_batch columns")
    n = {len(v) for v in nt.values()}
    if len(n) != 1:
        raise AdapterError("generate_sequences: non_tensor_batch columns differ in length %s" % sorted(n))
    size = n.pop()
    return [{k: (v[i].item() if hasattr(v[i], "item") and not isinstance(v[i], (dict, list, str)) else v[i])
             for k, v in nt.items()} for i in range(size)]


class RolloutAgentLoopManager:
    """``generate_sequences`` over rollout. ``config_yaml`` is the run config
    (its ``group_size`` is verl's ``rollout.n``; ``n`` is needed only when
    the batch has no ``uid`` column). ``prompt_length``/``response_length``
    are verl's ``rollout.prompt_length``/``response_length``: prompts are
    left-padded, responses right-padded to them, longer ones refused
    (prompt) or cut (response; its mask and logprobs with it).
    ``meta_info["global_steps"]`` is stamped as the groups' policy version;
    ``meta_info["validate"]`` is passed on as ``extra_fields``."""

    def __init__(self, client: Client, config_yaml: str, *, to_item: Callable[[Dict[str, Any]], Dict[str, Any]] = default_verl_item,
                 n: Optional[int] = None, prompt_length: Optional[int] = None, response_length: Optional[int] = None,
                 pad_token_id: int = 0, sampling: Optional[Dict[str, Any]] = None, stream_id: str = "",
                 timeout: Optional[float] = None):
        self.to_item = to_item
        self.n = n
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.pad_token_id = pad_token_id
        self.sampling = sampling_overrides(sampling)
        self.collector = ItemCollector(client, config_yaml, stream_id=stream_id, prefix="verl", timeout=timeout)

    def run(self, batch: Any) -> List[Dict[str, Any]]:
        rows = _rows(batch)
        if "uid" in rows[0]:
            runs = runs_by_key([r["uid"] for r in rows], "non_tensor_batch.uid")
        elif self.n:
            runs = split_runs(len(rows), self.n, "generate_sequences batch")
        else:
            raise AdapterError("generate_sequences: the batch has no uid column: give n")
        sizes = {len(r) for r in runs}
        if len(sizes) != 1:
            raise AdapterError("generate_sequences: prompts have different sample counts %s" % sorted(sizes))
        meta = getattr(batch, "meta_info", None) or {}
        step = meta.get("global_steps")
        items = [self.to_item(rows[r[0]]) for r in runs]
        groups = self.collector.collect(items, sizes.pop(), policy_version=step if isinstance(step, int) and step >= 0 else None,
                                        sampling=self.sampling or None)
        outs = []
        # verl's routed_experts: per sample, [prompt + response][layers][topk].
        experts = group_routing([r for g in groups for r in g.rollouts], "AgentLoopOutput.routed_experts")
        for g in groups:
            for r in g.rollouts:
                lp = r.response_logprobs
                outs.append({
                    "prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "response_mask": r.trainable_response_mask,
                    "response_logprobs": lp, "routed_experts": experts[len(outs)] if experts else None, "multi_modal_data": None,
                    "reward_score": r.reward if r.ok else 0.0, "num_turns": r.turns,
                    "metrics": {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1},
                    "extra_fields": {"rollout_status": r.status, "rollout_stop_reason": r.stop_reason,
                                     "rollout_group_id": g.group_id, "rollout_advantage": r.advantage,
                                     "validate": bool(meta.get("validate", False))},
                })
        return outs

    def generate_sequences(self, prompts: Any) -> Any:
        outs = self.run(prompts)
        tensors, non_tensors, meta = self.postprocess(outs)
        try:
            from verl.protocol import DataProto  # type: ignore
            import torch  # type: ignore
        except ImportError:
            return {"batch": tensors, "non_tensor_batch": non_tensors, "meta_info": meta}
        return DataProto.from_dict(tensors={k: torch.as_tensor(v) for k, v in tensors.items()},
                                   non_tensors=non_tensors, meta_info=meta)

    def postprocess(self, outs: List[Dict[str, Any]]):
        """The padded columns of verl's ``AgentLoopWorker._postprocess``."""
        if not outs:
            raise AdapterError("generate_sequences: an empty batch")
        plen = self.prompt_length or max(len(o["prompt_ids"]) for o in outs)
        rlen = self.response_length or max(max(len(o["response_ids"]) for o in outs), 1)
        cols: Dict[str, List[Any]] = {k: [] for k in ("prompts", "responses", "response_mask", "input_ids",
                                                      "attention_mask", "position_ids", "rollout_log_probs", "rm_scores")}
        with_logprobs = all(o["response_logprobs"] is not None for o in outs)
        # Routing aligned with input_ids (left-padded prompt, right-padded
        # response), zeros in the padding, as verl's _postprocess places it.
        with_routing = all(o.get("routed_experts") for o in outs)
        if with_routing:
            cols["routed_experts"] = []
        pad = self.pad_token_id
        for i, o in enumerate(outs):
            p = o["prompt_ids"]
            if len(p) > plen:
                raise AdapterError("sample %d: prompt of %d tokens over prompt_length %d" % (i, len(p), plen))
            resp, mask = o["response_ids"][:rlen], o["response_mask"][:rlen]
            lp = (o["response_logprobs"] or [])[:rlen]
            pgap, rgap = plen - len(p), rlen - len(resp)
            cols["prompts"].append([pad] * pgap + p)
            cols["responses"].append(resp + [pad] * rgap)
            cols["response_mask"].append(mask + [0] * rgap)
            attn = [0] * pgap + [1] * len(p) + [1] * len(resp) + [0] * rgap
            cols["attention_mask"].append(attn)
            cols["input_ids"].append(cols["prompts"][-1] + cols["responses"][-1])
            # verl's compute_position_id_with_mask: cumsum(mask) - 1,
            # clipped at 0 (left padding is 0).
            pos, k = [], 0
            for a in attn:
                k += a
                pos.append(max(k - 1, 0))
            cols["position_ids"].append(pos)
            cols["rollout_log_probs"].append(lp + [0.0] * (rlen - len(lp)))
            score = [0.0] * rlen
            if resp:
                score[len(resp) - 1] = float(o["reward_score"])
            cols["rm_scores"].append(score)
            if with_routing:
                re = o["routed_experts"]
                zero = [[0] * len(re[0][0]) for _ in re[0]]
                cols["routed_experts"].append([zero] * pgap + re[:len(p) + len(resp)] + [zero] * rgap)
        if not with_logprobs:
            del cols["rollout_log_probs"]
        non_tensors: Dict[str, Any] = {"__num_turns__": [o["num_turns"] for o in outs]}
        for key in sorted({k for o in outs for k in o["extra_fields"]}):
            non_tensors[key] = [o["extra_fields"].get(key) for o in outs]
        meta = {"metrics": [o["metrics"] for o in outs], "reward_extra_keys": []}
        if _np is not None:
            types = {"rollout_log_probs": _np.float32, "rm_scores": _np.float32}
            cols = {k: _np.asarray(v, dtype=types.get(k, _np.int64)) for k, v in cols.items()}
            nt = {}
            for k, v in non_tensors.items():
                arr = _np.empty(len(v), dtype=object)
                arr[:] = v
                nt[k] = arr
            non_tensors = nt
        return cols, non_tensors, meta

    def close(self) -> None:
        self.collector.close()


__all__ = ["RolloutAgentLoopManager", "default_verl_item"]
