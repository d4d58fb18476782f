"""A typed client for the standalone gateway, ``rollout gateway``
(``rollout.v1.GatewayService``; docs/gateway.md, "Standalone gateway").

The caller opens a session per rollout, points its own harness at the
session's base URL (any OpenAI or Anthropic SDK), closes the session when
the harness is done and posts the reward; the gateway records the exact
tokens, computes the group's advantages, writes it and hands it over::

    from rollout import GatewayClient

    with GatewayClient("127.0.0.1:50052") as gw:
        s = gw.open_session(item_id="task-7", group_size=4)
        run_my_agent(base_url=s.openai_base_url, api_key=s.api_key)
        gw.close_session(s.id)
        gw.score_session(s.id, reward=1.0)
        for group in gw.watch_groups():   # rollout.types.Group
            ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import grpc

from . import errors
from .client import _Connection, _layout
from .types import Group
from .v1 import rollout_pb2 as pb
from .v1 import rollout_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Session:
    """An open session: where its harness sends its calls."""

    id: str
    group_id: str
    index: int  # its place in the group
    openai_base_url: str  # for OpenAI Chat Completions and Responses clients
    anthropic_base_url: str  # for Anthropic Messages clients
    api_key: str  # a placeholder: the base URL is the credential
    expires_after_idle_seconds: float  # 0: never

    @classmethod
    def from_proto(cls, r: Any) -> "Session":
        return cls(id=r.session_id, group_id=r.group_id, index=r.index, openai_base_url=r.openai_base_url,
                   anthropic_base_url=r.anthropic_base_url, api_key=r.api_key,
                   expires_after_idle_seconds=r.expires_after_idle_seconds)


def _finite(name: str, v: float) -> float:
    v = float(v)
    if not math.isfinite(v):
        raise ValueError("%s: %r is not a finite number" % (name, v))
    return v


class GatewayClient(_Connection):
    """A connection to ``rollout gateway``'s session API (its ``--listen``
    address); the arguments are those of :class:`rollout.Client`."""

    _stub_class = pb_grpc.GatewayServiceStub

    def open_session(self, *, group_id: str = "", item_id: str = "", metadata: Optional[Mapping[str, str]] = None,
                     group_size: int = 0) -> Session:
        """Opens a session in group ``group_id`` (a new group when empty;
        the group's first session sets its item, metadata and size).
        :class:`rollout.ResourceExhausted` when the gateway holds its
        maximum of open sessions; :class:`rollout.FailedPrecondition` when
        the group is full or written."""
        if group_size < 0:
            raise ValueError("group_size: %d is negative" % group_size)
        req = pb.OpenSessionRequest(group_id=group_id, item_id=item_id, group_size=group_size)
        for k, v in (metadata or {}).items():
            req.metadata[str(k)] = str(v)
        return Session.from_proto(self._call("OpenSession", req))

    def close_session(self, session_id: str) -> Any:
        """Ends a session (its calls in flight are answered first) and
        returns its ``SessionSummary``: status, calls, tokens, how many
        echoed turns were rewritten or unanchored, and its branches."""
        return self._call("CloseSession", pb.CloseSessionRequest(session_id=session_id)).summary

    def score_session(self, session_id: str, reward: float, *, branch_rewards: Optional[Mapping[int, float]] = None,
                      metrics: Optional[Mapping[str, float]] = None) -> int:
        """Posts a closed session's reward (``metrics`` become the reward's
        components; ``branch_rewards`` override single branches'). Returns
        how many of the group's sessions are still pending: the score that
        makes it 0 writes the group."""
        req = pb.ScoreSessionRequest(session_id=session_id, reward=_finite("reward", reward))
        for b, v in (branch_rewards or {}).items():
            req.branch_rewards[int(b)] = _finite("branch_rewards[%d]" % b, v)
        for k, v in (metrics or {}).items():
            req.metrics[str(k)] = _finite("metrics[%s]" % k, v)
        return self._call("ScoreSession", req).pending

    def watch_groups(self, *, compact: bool = True, timeout: Optional[float] = None,
                     from_sequence: Optional[int] = None) -> Iterator[Group]:
        """Yields each finished group once (decoded, branches included),
        in completion order; groups finished while no one watched come
        first. Ends when the gateway shuts down; ``timeout`` bounds the
        whole stream (:class:`rollout.DeadlineExceeded`).

        With ``from_sequence`` the stream follows the run directory: every
        group whose ``sequence`` is at least this, those already written
        first, then each new one. Reconnecting with the last ``sequence``
        received plus one misses no group and repeats none, also across a
        gateway restart on the same run directory."""
        req = pb.WatchSessionGroupsRequest(token_layout=_layout(compact))
        if from_sequence is not None:
            if from_sequence < 0:
                raise ValueError("from_sequence must not be negative (got %d)" % from_sequence)
            req.from_sequence = int(from_sequence)
        try:
            for r in self._stub.WatchSessionGroups(req, metadata=self._meta, timeout=timeout):
                yield Group.from_proto(r.group)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, "WatchSessionGroups") from e
