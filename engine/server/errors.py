"""The server's domain errors. The gRPC servicer maps each to one status code.

InvalidRequest -> INVALID_ARGUMENT; Overloaded -> RESOURCE_EXHAUSTED;
Unavailable (and an actor Ray reports dead) -> UNAVAILABLE; UnknownModel ->
NOT_FOUND. They carry a
message for the client that names the problem; nothing else about them is
gRPC's.
"""

from __future__ import annotations

from ray.exceptions import RayActorError

# Ray's errors for an actor that died or cannot be reached (ActorDiedError and
# ActorUnavailableError are both RayActorErrors).
ActorGone = RayActorError


class InvalidRequest(ValueError):
    """Bad input; its message names the problem."""


class Unavailable(RuntimeError):
    """The engine cannot serve now (stopping, or the model actor is gone)."""


class Overloaded(RuntimeError):
    """Too many requests in flight."""


class UnknownModel(LookupError):
    """A requested model name no served model answers to; its message lists them."""
