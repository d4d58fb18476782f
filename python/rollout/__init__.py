"""rollout-client: Python client and trainer adapters for ``rollout serve``.

    from rollout import Client

    with Client("127.0.0.1:50051") as c:
        with c.collect(config_yaml, initial_credits=2, stream_id="train") as stream:
            stream.next(8, request_id="step-1")
            group = stream.get()          # rollout.types.Group
            stream.credit(1)

:class:`GatewayClient` drives a standalone ``rollout gateway`` (sessions for
harnesses that run elsewhere). Adapters for trainers live in :mod:`rollout.adapters` (TRL, SkyRL, verl).
See docs/python.md in the repository.
"""

from .batch import Batch, have_numpy, to_batch
from .client import Client, CollectStream, StreamClosed
from .errors import (Aborted, AlreadyExists, Cancelled, DeadlineExceeded, FailedPrecondition, Internal,
                     InvalidArgument, LayoutError, NotFound, PermissionDenied, ResourceExhausted, RolloutError,
                     Unauthenticated, Unavailable)
from .gateway import GatewayClient, Session
from .types import Group, Rollout, token_columns
from .v1 import rollout_pb2 as pb

__version__ = "0.1.0"

__all__ = [
    "Aborted", "AlreadyExists", "Batch", "Cancelled", "Client", "CollectStream", "DeadlineExceeded",
    "FailedPrecondition", "GatewayClient", "Group", "Internal", "InvalidArgument", "LayoutError", "NotFound", "PermissionDenied",
    "ResourceExhausted", "Rollout", "RolloutError", "Session", "StreamClosed", "Unauthenticated", "Unavailable",
    "have_numpy", "pb", "to_batch", "token_columns",
]
