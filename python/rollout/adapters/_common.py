"""What every adapter shares: one CollectGroups stream that turns a batch
of items into one group per item, in the batch's order."""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..client import Client, CollectStream
from ..errors import RolloutError
from ..types import Group


class AdapterError(RolloutError):
    """An adapter got input it cannot map, or groups that do not fit the
    trainer's batch (a wrong group size, a missing group)."""


def default_to_item(prompt: Any) -> Dict[str, Any]:
    """A prompt that already is an env item: a dict, or JSON text of an
    object. Anything else needs the adapter's ``to_item``."""
    if isinstance(prompt, dict):
        return dict(prompt)
    if isinstance(prompt, str):
        try:
            v = json.loads(prompt)
        except ValueError:
            v = None
        if isinstance(v, dict):
            return v
    raise AdapterError("prompt %.80r is not an env item (a dict or a JSON object): pass to_item= to map "
                       "your dataset's prompts to the env's item fields" % (prompt,))


class ItemCollector:
    """Collects one group per item over one ``CollectGroups`` stream, opened
    on first use with no credits: each batch grants exactly one credit per
    item, so nothing runs that no batch asked for. Thread-safe; one batch
    at a time."""

    def __init__(self, client: Client, config_yaml: str, *, stream_id: str = "", prefix: str = "batch",
                 timeout: Optional[float] = None):
        self.client = client
        self.config_yaml = config_yaml
        self.stream_id = stream_id
        self.timeout = timeout
        self._prefix = "%s-%s" % (prefix, uuid.uuid4().hex[:8])
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._stream: Optional[CollectStream] = None

    def stream(self) -> CollectStream:
        if self._stream is None:
            self._stream = self.client.collect(self.config_yaml, initial_credits=0, stream_id=self.stream_id)
        return self._stream

    def collect(self, items: Sequence[Dict[str, Any]], group_size: int, *, policy_version: Optional[int] = None,
                sampling: Optional[Dict[str, Any]] = None) -> List[Group]:
        """One group per item, in order, each of ``group_size`` rollouts.
        Items get an id unique in the request (``"<k>"``, or ``"<k>-<id>"``
        when they have one) so that groups map back to them."""
        if not items:
            return []
        with self._lock:
            request_id = "%s-%d" % (self._prefix, next(self._seq))
            want: Dict[str, int] = {}
            sent = []
            for k, it in enumerate(items):
                it = dict(it)
                it["id"] = "%d-%s" % (k, it["id"]) if it.get("id") not in (None, "") else str(k)
                want["%s/%s" % (request_id, it["id"])] = k
                sent.append(it)
            s = self.stream()
            try:
                return self._await(s, request_id, want, sent, group_size, policy_version, sampling)
            except BaseException:
                # Whatever of this request is still coming would meet the
                # next batch: start over on a new stream.
                self._stream = None
                s.cancel()
                raise

    def _await(self, s: CollectStream, request_id: str, want: Dict[str, int], sent: List[Dict[str, Any]],
               group_size: int, policy_version: Optional[int], sampling: Optional[Dict[str, Any]]) -> List[Group]:
        s.items(sent, request_id=request_id, policy_version=policy_version, sampling=sampling)
        s.credit(len(sent))
        out: List[Optional[Group]] = [None] * len(sent)
        missing = len(sent)
        while missing:
            g = s.get(timeout=self.timeout)
            k = want.get(g.item_id)
            if g.request_id != request_id or k is None or out[k] is not None:
                raise AdapterError("CollectGroups: group %s (item %s, request %s) was not asked for by %s"
                                   % (g.group_id, g.item_id, g.request_id, request_id))
            if len(g.rollouts) != group_size:
                raise AdapterError("group %s has %d rollouts, the trainer wants %d per prompt: set the run "
                                   "config's group_size to the trainer's" % (g.group_id, len(g.rollouts), group_size))
            out[k] = g
            missing -= 1
        return [g for g in out if g is not None]

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.cancel()
                self._stream = None


def split_runs(n: int, size: int, what: str) -> List[range]:
    """Consecutive runs of ``size`` among ``n`` entries (a batch whose
    prompts are repeated ``size`` times in a row)."""
    if size <= 0:
        raise AdapterError("%s: group size must be positive, got %d" % (what, size))
    if n % size:
        raise AdapterError("%s: %d entries are not whole groups of %d repeated prompts" % (what, n, size))
    return [range(i, i + size) for i in range(0, n, size)]


def check_repeated(values: Sequence[Any], runs: List[range], what: str, same: Callable[[Any, Any], bool] = None) -> None:
    """Each run must repeat one value: the trainer's batch layout."""
    eq = same or (lambda a, b: a == b)
    for r in runs:
        first = values[r[0]]
        for i in r[1:]:
            if not eq(values[i], first):
                raise AdapterError("%s: entry %d differs from entry %d of its group: the trainer repeats each "
                                   "prompt in a row" % (what, i, r[0]))


#: Sampling keys rollout's run config knows (docs/config.md, ``sampling``).
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed", "repetition_penalty",
                 "presence_penalty", "frequency_penalty")


def sampling_overrides(params: Optional[Dict[str, Any]], renames: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The trainer's sampling parameters rollout understands, renamed to
    its keys; the rest are left to the run config (docs/trainers/*.md)."""
    out: Dict[str, Any] = {}
    for k, v in (params or {}).items():
        k = (renames or {}).get(k, k)
        if k in SAMPLING_KEYS and v is not None:
            out[k] = v
    return out


#: rollout's stop reasons as the OpenAI/vLLM finish reasons trainers expect.
FINISH_REASONS = {"finished": "stop", "length": "length", "max_turns": "length", "context_length": "length"}


def finish_reason(stop_reason: str, status: str) -> str:
    if status != "ok":
        return "error"
    return FINISH_REASONS.get(stop_reason, stop_reason or "stop")


def runs_by_key(keys: Sequence[Any], what: str) -> List[range]:
    """Consecutive runs of equal keys (uid, instance id); a key that comes
    back after another is an error: groups must be contiguous."""
    runs: List[range] = []
    seen = set()
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            if keys[start] in seen:
                raise AdapterError("%s: the entries of %r are not contiguous" % (what, keys[start]))
            seen.add(keys[start])
            runs.append(range(start, i))
            start = i
    return runs


def group_routing(rollouts: Sequence[Any], what: str) -> Optional[List[Any]]:
    """The rollouts' routed experts (``Rollout.routed_experts``), each
    ``[len(tokens)][layers][topk]``: None when none carries routing; an
    AdapterError when only some do (the exports refuse the same)."""
    routing = [r.routed_experts() for r in rollouts]
    have = [x is not None for x in routing]
    if not any(have):
        return None
    if not all(have):
        raise AdapterError("%s: only %d of %d rollouts carry routed experts (inference.routed_experts): "
                           "refusing a batch with and without routing" % (what, sum(have), len(have)))
    return routing
