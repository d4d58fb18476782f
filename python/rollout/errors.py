"""Exceptions of the rollout client.

Every failed call raises a :class:`RolloutError` subclass chosen by the gRPC
status code the server answered with (docs/api.md, "Errors"); the original
``grpc.RpcError`` is kept as ``__cause__``. Decoding problems in a group the
server sent (token columns that do not add up) raise :class:`LayoutError`.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc


class RolloutError(Exception):
    """A call to ``rollout serve`` failed. ``code`` is the gRPC status code
    (``None`` for errors raised by the client itself), ``details`` the
    server's message, which names the offending field."""

    code: Optional[grpc.StatusCode] = None

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, details: str = ""):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details = details


class InvalidArgument(RolloutError, ValueError):
    """A malformed request or run config (INVALID_ARGUMENT)."""
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RolloutError, LookupError):
    """An unknown job, stream or environment (NOT_FOUND)."""
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(RolloutError):
    """A stream id that names an open stream or a job (ALREADY_EXISTS)."""
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(RolloutError, PermissionError):
    """A path or environment variable the server does not allow (PERMISSION_DENIED)."""
    code = grpc.StatusCode.PERMISSION_DENIED


class FailedPrecondition(RolloutError):
    """The server's state refuses the call, e.g. a policy update already in
    progress (FAILED_PRECONDITION)."""
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(RolloutError):
    """A concurrent call with the same id is in progress: retry (ABORTED)."""
    code = grpc.StatusCode.ABORTED


class Unauthenticated(RolloutError):
    """A missing or wrong bearer token (UNAUTHENTICATED)."""
    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(RolloutError):
    """Over a rate limit, quota or message size (RESOURCE_EXHAUSTED)."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(RolloutError, ConnectionError):
    """The server is shutting down or unreachable, or an engine did not answer
    (UNAVAILABLE)."""
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RolloutError, TimeoutError):
    """The call's timeout passed (DEADLINE_EXCEEDED)."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(RolloutError):
    """The call was cancelled (CANCELLED)."""
    code = grpc.StatusCode.CANCELLED


class Internal(RolloutError):
    """A server bug or an unclassified failure (INTERNAL, UNKNOWN and the rest)."""
    code = grpc.StatusCode.INTERNAL


class LayoutError(RolloutError, ValueError):
    """A rollout's token columns are inconsistent (docs/api.md, "Token layout")."""


_BY_CODE: Dict[grpc.StatusCode, Type[RolloutError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, AlreadyExists, PermissionDenied, FailedPrecondition, Aborted,
                Unauthenticated, ResourceExhausted, Unavailable, DeadlineExceeded, Cancelled, Internal)
}


def from_rpc_error(err: grpc.RpcError, what: str) -> RolloutError:
    """The RolloutError for a failed call ``what`` (an RPC name)."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else "") or ""
    cls = _BY_CODE.get(code, Internal) if code is not None else Internal
    name = code.name if code is not None else "UNKNOWN"
    return cls("%s: %s: %s" % (what, name, details), code=code, details=details)
