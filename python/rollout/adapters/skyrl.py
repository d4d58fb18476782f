"""SkyRL adapter (NovaSky-AI/SkyRL at a956457; docs/trainers/skyrl.md).

:class:`RolloutGenerator` implements SkyRL's ``GeneratorInterface``
(``skyrl/train/generators/base.py``): ``await generate(GeneratorInput)``
returns a ``GeneratorOutput`` dict whose rows follow the input's order. The
input's prompts are already repeated per sample (``n_samples_per_prompt``);
the rows of one prompt (the same ``trajectory_ids[i].instance_id``, or
``n_samples_per_prompt`` in a row) become one rollout group.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, List, Optional

from ..client import Client
from ._common import (AdapterError, ItemCollector, default_to_item, finish_reason, group_routing, runs_by_key,
                      sampling_overrides, split_runs)


def default_skyrl_item(prompt: Any, env_class: str, env_extra: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The row's ``env_extras`` entry is the env item (a dict with the env's
    fields); pass ``to_item`` for anything else."""
    if env_extra is None:
        raise AdapterError("SkyRL input has no env_extras: pass to_item=(prompt, env_class, env_extra) -> item")
    return default_to_item(env_extra)


class RolloutGenerator:
    """``GeneratorInterface`` over rollout. ``config_yaml`` is the run
    config (its ``group_size`` must be SkyRL's ``n_samples_per_prompt``,
    also given here when the input carries no trajectory ids).
    ``batch_metadata.global_step`` is stamped as the groups' policy version;
    ``sampling_params`` keys rollout knows override the config's sampling
    (``max_generate_length`` is ``max_tokens``)."""

    def __init__(self, client: Client, config_yaml: str, *,
                 to_item: Callable[[Any, str, Optional[Dict[str, Any]]], Dict[str, Any]] = default_skyrl_item,
                 n_samples_per_prompt: Optional[int] = None, stream_id: str = "", timeout: Optional[float] = None):
        self.to_item = to_item
        self.n = n_samples_per_prompt
        self.collector = ItemCollector(client, config_yaml, stream_id=stream_id, prefix="skyrl", timeout=timeout)

    async def generate(self, input_batch: Dict[str, Any]) -> Dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(None, self.generate_sync, input_batch)

    def generate_sync(self, input_batch: Dict[str, Any]) -> Dict[str, Any]:
        prompts = input_batch["prompts"]
        n = len(prompts)
        env_classes = input_batch.get("env_classes") or [""] * n
        env_extras = input_batch.get("env_extras") or [None] * n
        traj_ids = input_batch.get("trajectory_ids")
        if len(env_classes) != n or len(env_extras) != n or (traj_ids is not None and len(traj_ids) != n):
            raise AdapterError("GeneratorInput: prompts, env_classes, env_extras and trajectory_ids differ in length")
        if traj_ids is not None:
            runs = runs_by_key([t.instance_id for t in traj_ids], "GeneratorInput.trajectory_ids")
        elif self.n:
            runs = split_runs(n, self.n, "GeneratorInput.prompts")
        else:
            raise AdapterError("GeneratorInput has no trajectory_ids: give n_samples_per_prompt")
        sizes = {len(r) for r in runs}
        if len(sizes) != 1:
            raise AdapterError("GeneratorInput: prompts have different sample counts %s" % sorted(sizes))
        size = sizes.pop()
        meta = input_batch.get("batch_metadata")
        step = getattr(meta, "global_step", None)
        sampling = sampling_overrides(input_batch.get("sampling_params"), {"max_generate_length": "max_tokens"})
        items = [self.to_item(prompts[r[0]], env_classes[r[0]], env_extras[r[0]]) for r in runs]
        groups = self.collector.collect(items, size, policy_version=step, sampling=sampling or None)

        out: Dict[str, List[Any]] = {k: [] for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks",
                                                     "stop_reasons", "rollout_logprobs")}
        logprobs_complete = True
        for g in groups:
            for r in g.rollouts:
                out["prompt_token_ids"].append(r.prompt_ids)
                out["response_ids"].append(r.response_ids)
                out["rewards"].append(r.reward if r.ok else 0.0)
                out["loss_masks"].append(r.trainable_response_mask)
                out["stop_reasons"].append(finish_reason(r.stop_reason, r.status))
                lp = r.response_logprobs
                logprobs_complete = logprobs_complete and lp is not None
                out["rollout_logprobs"].append(lp)
        rollouts = [r for g in groups for r in g.rollouts]
        ok = [r for r in rollouts if r.ok]
        metrics = {
            "rollout/num_groups": float(len(groups)),
            "rollout/failed_rollouts": float(len(rollouts) - len(ok)),
            "rollout/avg_reward": sum(r.reward for r in ok) / len(ok) if ok else 0.0,
            "rollout/avg_turns": sum(r.turns for r in ok) / len(ok) if ok else 0.0,
            "rollout/max_policy_lag": float(max((g.policy_lag or 0) for g in groups)) if groups else 0.0,
        }
        result: Dict[str, Any] = dict(out)
        if not logprobs_complete:
            result["rollout_logprobs"] = None
        # Per-row env metrics (GeneratorOutput.env_metrics): what rollout
        # knows of each episode that SkyRL has no column for.
        env_metrics = [{"rollout_status": r.status, "failure_kind": r.failure_kind, "stop_reason": r.stop_reason,
                        "turns": r.turns, "group_id": g.group_id, "policy_lag": g.policy_lag}
                       for g in groups for r in g.rollouts]
        # SkyRL's rollout_expert_indices: [seq_len, layers, topk] per
        # trajectory over prompt + response, zero-padded.
        experts = group_routing(rollouts, "GeneratorOutput.rollout_expert_indices")
        result.update(rollout_metrics=metrics, trajectory_ids=traj_ids, rollout_expert_indices=experts,
                      trajectory_generation_times=None, trajectory_time_splits=None, is_last_step=None,
                      env_metrics=env_metrics, pixel_values=None, image_grid_thw=None)
        return result

    def close(self) -> None:
        self.collector.close()


__all__ = ["RolloutGenerator", "default_skyrl_item"]
