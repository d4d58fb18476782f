"""A typed client for ``rollout serve`` (docs/api.md, docs/python.md).

:class:`Client` wraps every RPC of ``rollout.v1.RolloutService``; failed
calls raise :mod:`rollout.errors` exceptions. :meth:`Client.collect` opens a
``CollectGroups`` stream as a :class:`CollectStream`: requests are sent from
any thread, a reader thread receives the groups, and :meth:`CollectStream.get`
hands them over decoded (:class:`rollout.types.Group`).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from . import errors
from .types import Group
from .v1 import rollout_pb2 as pb
from .v1 import rollout_pb2_grpc as pb_grpc

#: gRPC's default receive limit (4 MiB) is below a large group.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

_MODES = {"run": pb.JOB_MODE_RUN, "eval": pb.JOB_MODE_EVAL}
_UPDATE_MODES = ("keep", "wait", "abort")


def _layout(compact: bool) -> int:
    return pb.TOKEN_LAYOUT_COMPACT if compact else pb.TOKEN_LAYOUT_FULL


class _Connection:
    """A gRPC channel to a rollout service at ``addr`` (``host:port`` or
    ``unix:PATH``) with its bearer token (``token`` or the file
    ``token_file``) and the deadline of each unary call (``timeout``,
    seconds). Use it as a context manager or call :meth:`close`."""

    _stub_class: Any = None

    def __init__(self, addr: str, *, token: Optional[str] = None, token_file: Optional[str] = None,
                 timeout: float = 60.0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 channel: Optional[grpc.Channel] = None,
                 options: Sequence[Tuple[str, Any]] = ()):
        if token is not None and token_file is not None:
            raise ValueError("token and token_file: give one")
        if token_file is not None:
            with open(token_file) as f:
                token = f.read().strip()
            if not token:
                raise ValueError("token_file %s is empty" % token_file)
        self.addr = addr
        self.timeout = timeout
        self._meta: List[Tuple[str, str]] = [("authorization", "Bearer " + token)] if token else []
        self._own_channel = channel is None
        self._channel = channel or grpc.insecure_channel(addr, options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ] + list(options))
        self._stub = self._stub_class(self._channel)

    # Lifecycle.

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Blocks until the channel connects; Unavailable after ``timeout``."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise errors.Unavailable("%s: not reachable within %.0f s" % (self.addr, timeout),
                                     code=grpc.StatusCode.UNAVAILABLE) from None

    def _call(self, name: str, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return getattr(self._stub, name)(request, metadata=self._meta,
                                             timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, name) from e


class Client(_Connection):
    """A connection to ``rollout serve`` (``rollout.v1.RolloutService``);
    the arguments are :class:`_Connection`'s."""

    _stub_class = pb_grpc.RolloutServiceStub

    # Service identity and the env catalogue.

    def version(self) -> Any:
        """``GetVersionResponse``: version, commit, go_version, docker_api_version."""
        return self._call("GetVersion", pb.GetVersionRequest())

    def list_environments(self) -> List[Any]:
        """Every registered env (``rollout.v1.Environment``)."""
        return list(self._call("ListEnvironments", pb.ListEnvironmentsRequest()).environments)

    def describe_environment(self, name: str) -> Dict[str, Any]:
        """One env: ``environment`` (the message), ``config_schema`` (the
        JSON schema of its env_config, decoded) and ``default_config_yaml``."""
        r = self._call("DescribeEnvironment", pb.DescribeEnvironmentRequest(name=name))
        schema = json.loads(r.config_schema_json) if r.config_schema_json else {}
        return {"environment": r.environment, "config_schema": schema, "default_config_yaml": r.default_config_yaml}

    # Jobs.

    def start_job(self, config_yaml: Optional[str] = None, *, config_path: Optional[str] = None,
                  job_id: str = "", mode: str = "run") -> Any:
        """Starts a job from a run config (YAML text, or a file on the
        server); returns the ``rollout.v1.Job``. With ``job_id`` the call is
        idempotent."""
        if (config_yaml is None) == (config_path is None):
            raise ValueError("start_job: give exactly one of config_yaml and config_path")
        if mode not in _MODES:
            raise ValueError("start_job: mode %r: want one of %s" % (mode, sorted(_MODES)))
        req = pb.StartJobRequest(job_id=job_id, mode=_MODES[mode])
        if config_yaml is not None:
            req.config_yaml = config_yaml
        else:
            req.config_path = config_path
        return self._call("StartJob", req).job

    def get_job(self, job_id: str) -> Any:
        return self._call("GetJob", pb.GetJobRequest(job_id=job_id)).job

    def list_jobs(self) -> List[Any]:
        return list(self._call("ListJobs", pb.ListJobsRequest()).jobs)

    def cancel_job(self, job_id: str, cancel_in_flight: bool = False) -> Any:
        return self._call("CancelJob", pb.CancelJobRequest(job_id=job_id, cancel_in_flight=cancel_in_flight)).job

    def watch_job(self, job_id: str, *, include_groups: bool = True, from_sequence: Optional[int] = None,
                  compact: bool = True, timeout: Optional[float] = None) -> Iterator[Tuple[str, Any]]:
        """Follows a job to its end, yielding ``("progress", JobProgress)``,
        ``("group", Group)`` (decoded) and finally ``("finished", Job)``.
        ``from_sequence=0`` replays every group of the job."""
        req = pb.WatchJobRequest(job_id=job_id, include_groups=include_groups, token_layout=_layout(compact))
        if from_sequence is not None:
            req.from_sequence = from_sequence
        try:
            for ev in self._stub.WatchJob(req, metadata=self._meta, timeout=timeout):
                kind = ev.WhichOneof("event")
                if kind == "group":
                    yield kind, Group.from_proto(ev.group)
                elif kind is not None:
                    yield kind, getattr(ev, kind)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, "WatchJob") from e

    # Policy updates (docs/async-rl.md).

    def begin_policy_update(self, job_id: str, version: int, mode: str = "keep") -> Any:
        """Pauses admission and the engines of a job or stream while the
        trainer loads weights ``version``. ``mode``: keep, wait or abort."""
        if mode not in _UPDATE_MODES:
            raise ValueError("begin_policy_update: mode %r: want one of %s" % (mode, _UPDATE_MODES))
        return self._call("BeginPolicyUpdate", pb.BeginPolicyUpdateRequest(job_id=job_id, version=version, mode=mode))

    def end_policy_update(self, job_id: str, version: int) -> Any:
        """Resumes the engines; later tokens are stamped ``version``."""
        return self._call("EndPolicyUpdate", pb.EndPolicyUpdateRequest(job_id=job_id, version=version))

    @contextlib.contextmanager
    def policy_update(self, job_id: str, version: int, mode: str = "keep") -> Iterator[Any]:
        """``with client.policy_update(stream_id, v): load_weights()`` —
        Begin before the block, End after it. When the block raises, End is
        not called (the new weights are not known to be loaded) and the
        engines stay paused: the trainer decides whether to retry or stop."""
        begin = self.begin_policy_update(job_id, version, mode)
        yield begin
        self.end_policy_update(job_id, version)

    # Trainer-driven collection.

    def collect(self, config_yaml: str, *, initial_credits: int = 1, stream_id: str = "",
                compact: bool = True, from_sequence: Optional[int] = None,
                timeout: Optional[float] = None,
                on_status: Optional[Callable[[Any], None]] = None) -> "CollectStream":
        """Opens a ``CollectGroups`` stream for a run config. Use it as a
        context manager; see :class:`CollectStream`. ``on_status`` is called
        with every ``CollectStatus`` (from the stream's reader thread)."""
        if initial_credits < 0:
            raise ValueError("initial_credits must be >= 0, got %d" % initial_credits)
        start = pb.CollectStart(config_yaml=config_yaml, initial_credits=initial_credits, stream_id=stream_id,
                                token_layout=_layout(compact))
        if from_sequence is not None:
            start.from_sequence = from_sequence
        return CollectStream(self._stub, self._meta, start, timeout, on_status)


_CLOSE = object()


class StreamClosed(errors.RolloutError):
    """The CollectGroups stream ended (the server finished it after a
    half-close, or the client closed it) while a group was awaited."""


class CollectStream:
    """A ``CollectGroups`` stream. ``next``/``items`` request groups,
    ``credit`` lets the service start more; :meth:`get` returns the next
    group. ``status`` is the latest ``CollectStatus``. The service never has
    more groups started than credits granted: grant one per group consumed.
    :meth:`close` half-closes the stream: groups in flight are still
    delivered to :meth:`get` until it raises StreamClosed. Leaving a
    ``with`` block cancels the stream (in-flight rollouts are cancelled)."""

    def __init__(self, stub: Any, meta: List[Tuple[str, str]], start: Any, timeout: Optional[float],
                 on_status: Optional[Callable[[Any], None]] = None):
        self.stream_id = start.stream_id
        self._on_status = on_status
        self.status: Optional[Any] = None
        self._out: "queue.Queue[Any]" = queue.Queue()
        self._in: "queue.Queue[Any]" = queue.Queue()
        self._lock = threading.Lock()
        self._half_closed = False
        self._ended: Optional[BaseException] = None
        self._out.put(pb.CollectGroupsRequest(start=start))
        self._call = stub.CollectGroups(self._requests(), metadata=meta, timeout=timeout)
        self._reader = threading.Thread(target=self._read, name="rollout-collect-reader", daemon=True)
        self._reader.start()

    def __enter__(self) -> "CollectStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        # Leaving the block ends the stream at once: nothing outlives it.
        self.cancel()

    def _requests(self) -> Iterator[Any]:
        while True:
            msg = self._out.get()
            if msg is _CLOSE:
                return
            yield msg

    def _read(self) -> None:
        try:
            for resp in self._call:
                kind = resp.WhichOneof("msg")
                if kind == "status":
                    with self._lock:
                        self.status = resp.status
                    if self._on_status is not None:
                        self._on_status(resp.status)
                elif kind == "group":
                    self._in.put(("group", resp.group))
            self._in.put(("end", None))
        except grpc.RpcError as e:
            self._in.put(("error", errors.from_rpc_error(e, "CollectGroups")))
        except Exception as e:  # an on_status callback failed: the caller sees it
            self._call.cancel()
            self._in.put(("error", e))

    def _send(self, msg: Any) -> None:
        with self._lock:
            if self._half_closed:
                raise StreamClosed("CollectGroups: the stream is closed")
            self._out.put(msg)

    def next(self, count: int, *, request_id: str = "", policy_version: Optional[int] = None,
             sampling: Optional[Dict[str, Any]] = None) -> None:
        """Asks for the next ``count`` items of the config's dataset."""
        if count <= 0:
            raise ValueError("next: count must be positive, got %d" % count)
        req = pb.CollectNext(request_id=request_id, count=count,
                             sampling_json=json.dumps(sampling) if sampling else "")
        if policy_version is not None:
            req.policy_version = policy_version
        self._send(pb.CollectGroupsRequest(next=req))

    def items(self, items: Sequence[Union[Dict[str, Any], str]], *, request_id: str = "",
              policy_version: Optional[int] = None, sampling: Optional[Dict[str, Any]] = None) -> None:
        """Asks for one group per item (JSON objects with the env's fields,
        as dicts or JSON text); their ids get the prefix ``request_id/``."""
        if not items:
            raise ValueError("items: no items")
        texts = []
        for i, it in enumerate(items):
            if isinstance(it, str):
                texts.append(it)
            elif isinstance(it, dict):
                texts.append(json.dumps(it))
            else:
                raise TypeError("items[%d]: want a dict or JSON text, got %s" % (i, type(it).__name__))
        req = pb.CollectItems(request_id=request_id, items_json=texts,
                              sampling_json=json.dumps(sampling) if sampling else "")
        if policy_version is not None:
            req.policy_version = policy_version
        self._send(pb.CollectGroupsRequest(items=req))

    def credit(self, groups: int = 1, *, trainer_version: Optional[int] = None) -> None:
        """Grants ``groups`` more groups; ``trainer_version`` reports the
        trainer's policy version (with ``groups=0`` it only reports it)."""
        if groups < 0:
            raise ValueError("credit: groups must be >= 0, got %d" % groups)
        req = pb.CollectCredit(groups=groups)
        if trainer_version is not None:
            req.trainer_version = trainer_version
        self._send(pb.CollectGroupsRequest(credit=req))

    def get(self, timeout: Optional[float] = None) -> Group:
        """The next group, decoded. Raises DeadlineExceeded after
        ``timeout`` seconds, StreamClosed when the stream ended, or the
        error the stream ended with."""
        g = self.poll(timeout)
        if g is None:
            raise errors.DeadlineExceeded("CollectGroups: no group within %.1f s" % (timeout or 0),
                                          code=grpc.StatusCode.DEADLINE_EXCEEDED)
        return g

    def poll(self, timeout: Optional[float] = None) -> Optional[Group]:
        """Like :meth:`get`, but None when no group came within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ended is not None:
                raise self._ended
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                kind, val = self._in.get(timeout=left)
            except queue.Empty:
                return None
            if kind == "group":
                return Group.from_proto(val)
            if kind == "end":
                self._ended = StreamClosed("CollectGroups: the stream ended")
            elif kind == "error":
                self._ended = val

    def __iter__(self) -> Iterator[Group]:
        """Groups until the stream ends (after :meth:`close`, or when the
        server ends it); errors are raised."""
        while True:
            try:
                yield self.get()
            except StreamClosed:
                return

    def close(self) -> None:
        """Half-closes the stream: the server sends the groups in flight and
        ends it; queued items are dropped."""
        with self._lock:
            if not self._half_closed:
                self._half_closed = True
                self._out.put(_CLOSE)

    def cancel(self) -> None:
        """Ends the stream at once; the server cancels in-flight rollouts."""
        self.close()
        self._call.cancel()
        self._reader.join()

    def wait_closed(self, timeout: Optional[float] = None) -> None:
        """Waits for the reader to finish after :meth:`close`."""
        self._reader.join(timeout)
