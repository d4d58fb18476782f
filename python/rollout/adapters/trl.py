"""TRL adapters (huggingface/trl at f2cd577, 1.10.0.dev0; docs/trainers/trl.md).

- :class:`RolloutFunc` is a ``rollout_func`` for ``GRPOTrainer``: called as
  ``rollout_func(prompts, trainer)`` with the prompts repeated
  ``num_generations`` times in a row, it collects one group per distinct
  prompt and returns ``prompt_ids``, ``completion_ids``, ``logprobs`` and
  ``env_mask`` (unpadded rows: the trainer left-pads prompts itself), plus
  ``rollout_*`` keys that reach reward functions (:func:`env_reward`).
- :class:`AsyncRolloutWorker` implements ``RolloutWorkerProtocol`` of
  ``trl.experimental.async_grpo`` (``rollout_buffer``, ``start``, ``stop``,
  ``update_model_version``, ``check_health``), filling the buffer with
  :class:`RolloutSample`-shaped samples from a ``CollectGroups`` stream.
- :class:`PolicyUpdateTransfer` wraps the trainer's weight transfer so that
  its pause/resume become ``BeginPolicyUpdate``/``EndPolicyUpdate``.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..client import Client, CollectStream, StreamClosed
from ..types import Group
from ._common import AdapterError, ItemCollector, check_repeated, default_to_item, split_runs


def env_reward(completions: Any = None, rollout_reward: Optional[List[Optional[float]]] = None,
               **kwargs: Any) -> List[Optional[float]]:
    """A TRL reward function returning the env's reward of each completion
    (None for a rollout that failed: TRL counts it as missing)."""
    if rollout_reward is None:
        raise AdapterError("env_reward: no rollout_reward column: use it with RolloutFunc")
    return list(rollout_reward)


def _trainer_int(trainer: Any, name: str) -> Optional[int]:
    v = getattr(trainer, name, None)
    if v is None:
        v = getattr(getattr(trainer, "args", None), name, None)
    return v


def _token_ids(trainer: Any) -> Dict[str, Optional[int]]:
    tok = getattr(trainer, "processing_class", None)
    tok = getattr(tok, "tokenizer", tok)
    return {"eos": getattr(tok, "eos_token_id", None), "pad": getattr(tok, "pad_token_id", None)}


class RolloutFunc:
    """``GRPOTrainer(..., rollout_func=RolloutFunc(client, config_yaml))``.

    ``config_yaml`` is the run config (env, inference, sampling); its
    ``group_size`` must equal ``num_generations``. ``to_item(prompt)`` maps
    one of the trainer's prompts to the env's item (default: the prompt is
    the item, as a dict or JSON text). The trainer's ``state.global_step``
    is stamped on the groups as their policy version."""

    def __init__(self, client: Client, config_yaml: str, *, to_item: Callable[[Any], Dict[str, Any]] = default_to_item,
                 stream_id: str = "", timeout: Optional[float] = None):
        self.to_item = to_item
        self.collector = ItemCollector(client, config_yaml, stream_id=stream_id, prefix="trl", timeout=timeout)
        self.last_groups: List[Group] = []

    def __call__(self, prompts: List[Any], trainer: Any) -> Dict[str, Any]:
        n = _trainer_int(trainer, "num_generations")
        if not isinstance(n, int) or n <= 0:
            raise AdapterError("rollout_func: the trainer has no num_generations")
        runs = split_runs(len(prompts), n, "rollout_func prompts")
        check_repeated(prompts, runs, "rollout_func prompts")
        items = [self.to_item(prompts[r[0]]) for r in runs]
        step = getattr(getattr(trainer, "state", None), "global_step", None)
        groups = self.collector.collect(items, n, policy_version=step)
        self.last_groups = groups
        ids = _token_ids(trainer)
        filler = ids["eos"] if ids["eos"] is not None else ids["pad"]
        out: Dict[str, List[Any]] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "rollout_reward", "rollout_advantage",
            "rollout_status", "rollout_stop_reason", "rollout_group_id", "rollout_id")}
        any_missing_logprobs = False
        for g in groups:
            for r in g.rollouts:
                prompt, completion, mask = r.prompt_ids, r.response_ids, r.trainable_response_mask
                lp = r.response_logprobs
                if not completion:
                    # A rollout with no completion (an infrastructure
                    # failure): TRL wants a non-empty row; one untrained
                    # EOS, no reward.
                    if filler is None:
                        raise AdapterError("rollout %s has no tokens and the trainer's tokenizer has no "
                                           "eos_token_id/pad_token_id to stand in" % r.rollout_id)
                    completion, mask, lp = [filler], [0], [0.0]
                if not prompt:
                    prompt = [ids["pad"] if ids["pad"] is not None else filler]
                if lp is None:
                    any_missing_logprobs = True
                out["prompt_ids"].append(prompt)
                out["completion_ids"].append(completion)
                out["logprobs"].append(lp)
                out["env_mask"].append(mask)
                out["rollout_reward"].append(r.reward if r.ok else None)
                out["rollout_advantage"].append(r.advantage)
                out["rollout_status"].append(r.status)
                out["rollout_stop_reason"].append(r.stop_reason)
                out["rollout_group_id"].append(g.group_id)
                out["rollout_id"].append(r.rollout_id)
        result: Dict[str, Any] = dict(out)
        if any_missing_logprobs:
            result["logprobs"] = None  # the engine returned none: TRL recomputes
        return result

    def close(self) -> None:
        self.collector.close()


@dataclass
class RolloutSample:
    """The sample ``AsyncGRPOTrainer`` drains from ``rollout_buffer``
    (field for field TRL's ``RolloutSample``): ``input_ids`` is the whole
    sequence, ``completion_mask`` and ``old_log_probs`` are aligned with it
    (0 on the prompt and on env tokens)."""

    prompt: List[Dict[str, Any]]
    completion: List[Dict[str, Any]]
    input_ids: List[int]
    completion_mask: List[int]
    old_log_probs: List[float]
    advantage: float
    model_version: int
    group_id: int
    metrics: Dict[str, float] = field(default_factory=dict)


def samples_of(g: Group, group_index: int) -> List[RolloutSample]:
    """The group's ok rollouts as samples (failed ones carry nothing to
    learn from). The model version is the oldest policy that sampled a
    token of the group, so the trainer's staleness check is conservative."""
    version = g.min_policy_version if g.min_policy_version is not None else (g.policy_version or 0)
    out = []
    for r in g.rollouts:
        if not r.ok:
            continue
        msgs = r.messages()
        first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
        lp = r.logprobs or [0.0] * len(r.tokens)
        out.append(RolloutSample(
            prompt=msgs[:first], completion=msgs[first:], input_ids=list(r.tokens),
            completion_mask=list(r.loss_mask),
            old_log_probs=[x if m else 0.0 for x, m in zip(lp, r.loss_mask)],
            advantage=r.advantage if r.advantage is not None else 0.0, model_version=version,
            group_id=group_index,
            metrics={"reward": r.reward, "reward_std": g.std, "policy_lag": float(g.policy_lag or 0),
                     "turns": float(r.turns)}))
    return out


class AsyncRolloutWorker:
    """A rollout worker for ``AsyncGRPOTrainer(rollout_worker=...)``.

    It keeps ``max_inflight_groups`` groups of the config's dataset in
    flight on a ``CollectGroups`` stream named ``stream_id`` (default: a
    fresh one; name it in ``BeginPolicyUpdate``), pushes each group's
    samples onto ``rollout_buffer`` (blocking while the buffer is full, so
    the buffer bounds what runs ahead) and grants the next credit. When the
    dataset runs out it opens a new stream (the next epoch), ``epochs``
    times at most (None: forever). ``update_model_version`` reports the
    trainer's version to the service (``credit.trainer_version``), which
    enforces ``async.max_staleness`` of the config."""

    def __init__(self, client: Client, config_yaml: str, *, stream_id: str = "", max_inflight_groups: int = 2,
                 queue_maxsize: int = 0, epochs: Optional[int] = None, timeout: Optional[float] = None):
        if max_inflight_groups <= 0:
            raise ValueError("max_inflight_groups must be positive, got %d" % max_inflight_groups)
        self.client = client
        self.config_yaml = config_yaml
        self.stream_id = stream_id or "trl-async-" + uuid.uuid4().hex[:8]
        self.max_inflight_groups = max_inflight_groups
        self.epochs = epochs
        self.timeout = timeout
        self.rollout_buffer: "queue.Queue[RolloutSample]" = queue.Queue(maxsize=queue_maxsize)
        self.model_version = 0
        self.groups_received = 0
        self._heartbeat = time.time()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stream: Optional[CollectStream] = None
        self._lock = threading.Lock()
        self._failure: Optional[BaseException] = None
        self._finished = False

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncRolloutWorker: already started")
        self._thread = threading.Thread(target=self._run, name="rollout-trl-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            s = self._stream
        if s is not None:
            s.cancel()
        if self._thread is not None:
            self._thread.join()

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version
        with self._lock:
            s = self._stream
        if s is not None:
            try:
                s.credit(0, trainer_version=model_version)
            except StreamClosed:
                pass  # between epochs: the next stream starts with it

    def check_health(self, stale_after_s: float) -> None:
        if self._failure is not None:
            raise RuntimeError("rollout worker failed: %s" % self._failure) from self._failure
        if self._finished:
            raise RuntimeError("rollout worker finished: the dataset ran out after %s epoch(s)" % self.epochs)
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError("rollout worker produced no group for %.0f s (> %.0f s); stream %s, last status %s"
                               % (age, stale_after_s, self.stream_id, self._stream.status if self._stream else None))

    def _run(self) -> None:
        epoch = 0
        try:
            while not self._stop.is_set() and (self.epochs is None or epoch < self.epochs):
                epoch += 1
                if not self._one_epoch():
                    break
            if not self._stop.is_set():
                self._finished = True
        except BaseException as e:  # surfaced by check_health
            if not self._stop.is_set():
                self._failure = e

    def _one_epoch(self) -> bool:
        """Collects until the dataset is exhausted; False when stopped."""
        s = self.client.collect(self.config_yaml, initial_credits=self.max_inflight_groups,
                                stream_id=self.stream_id, timeout=self.timeout)
        with self._lock:
            self._stream = s
        try:
            if self.model_version:
                s.credit(0, trainer_version=self.model_version)
            # Ask for the dataset as credits allow, one item per group
            # consumed; `exhausted` marks the epoch's end.
            s.next(self.max_inflight_groups, request_id="epoch")
            while not self._stop.is_set():
                try:
                    g = s.poll(timeout=1.0)
                except StreamClosed:
                    return True
                if g is None:
                    st = s.status
                    if st is not None and st.exhausted and st.in_flight == 0 and st.queued == 0:
                        s.close()  # the epoch is over: the server ends the stream
                    continue
                self._heartbeat = time.time()
                self.groups_received += 1
                for sample in samples_of(g, self.groups_received):
                    while not self._stop.is_set():
                        try:
                            self.rollout_buffer.put(sample, timeout=0.5)
                            break
                        except queue.Full:
                            self._heartbeat = time.time()  # waiting on the trainer, not hung
                if not self._stop.is_set():
                    try:
                        st = s.status
                        if st is None or not st.exhausted:
                            s.next(1, request_id="epoch")
                        s.credit(1)
                    except StreamClosed:
                        pass
            return False
        finally:
            with self._lock:
                self._stream = None
            s.cancel()


class PolicyUpdateTransfer:
    """Wraps ``AsyncGRPOTrainer``'s weight transfer (``WeightTransferProtocol``):
    ``pause`` calls ``BeginPolicyUpdate`` for the worker's stream (``mode``
    keep, wait or abort) before the inner pause, ``resume`` calls the inner
    resume then ``EndPolicyUpdate``, so rollout stamps later tokens with the
    new version. ``inner`` moves the weights (e.g. TRL's NCCL client);
    None when rollout's engines need nothing from it."""

    def __init__(self, client: Client, worker: AsyncRolloutWorker, inner: Any = None, mode: str = "keep"):
        self.client, self.worker, self.inner, self.mode = client, worker, inner, mode
        self._pending: Optional[int] = None

    def init_weight_transfer(self) -> None:
        if self.inner is not None:
            self.inner.init_weight_transfer()

    def pause(self) -> None:
        version = self.worker.model_version + 1
        self.client.begin_policy_update(self.worker.stream_id, version, self.mode)
        self._pending = version
        if self.inner is not None:
            self.inner.pause()

    def send_weights(self, iterator: Any) -> None:
        if self.inner is not None:
            self.inner.send_weights(iterator)
        else:
            for _ in iterator:  # nothing to send; the trainer's collectives still run
                pass

    def resume(self) -> None:
        if self.inner is not None:
            self.inner.resume()
        if self._pending is None:
            raise AdapterError("PolicyUpdateTransfer.resume without pause")
        version, self._pending = self._pending, None
        self.client.end_policy_update(self.worker.stream_id, version)

    def destroy(self) -> None:
        if self.inner is not None:
            self.inner.destroy()


__all__ = ["AsyncRolloutWorker", "PolicyUpdateTransfer", "RolloutFunc", "RolloutSample", "env_reward", "samples_of"]
