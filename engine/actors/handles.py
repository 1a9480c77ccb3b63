"""What the front end calls on the actors: the model replica's and the cache manager's methods.

A Ray handle's method is called as `handle.name.remote(*args)` and answers an ObjectRef
(awaitable), so an editor cannot follow such a call into the actor. `ModelCalls` and
`ManagerCalls` list the methods the front end (engine.server: frontend, supervisor,
serve) calls, each with its arguments and answer; `ModelActor` and `CacheManagerActor`
implement them (tests/actors/test_handles.py holds each actor to its Protocol, and the
test fakes implement them too). `Handle[ModelCalls]` in a type hint is a Ray handle to
an actor that implements `ModelCalls`. Plain Python: no Ray here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from engine.actors.event_stream import EventAddress
    from engine.actors.hello import Hello
    from engine.cache.messages import (
        AnchorUse,
        CacheStats,
        Orders,
        PlanRequest,
        Release,
        RestorePlan,
    )
    from engine.cache.tree import CacheTree
    from engine.runtime.model.loader import ModelInfo
    from engine.runtime.requests import GenerationRequest
    from engine.runtime.tier.stats import GeneratorStats

T = TypeVar("T")


class Handle(Generic[T]):
    """A Ray actor handle whose actor implements `T` (type hints only): each method of `T`
    is called as `handle.name.remote(...)`, and its answer awaited."""


@runtime_checkable
class ModelCalls(Protocol):
    """What the front end calls on a model replica (engine.actors.model.ModelActor)."""

    def info(self) -> ModelInfo:
        """What the rest of the engine learns about the served model."""

    def attach(self, manager, peers=()) -> None:
        """The cache manager's handle, and the other replicas' (for fetches)."""

    async def hello(self, loop_deadline: float = 10.0) -> Hello:
        """Alive, and its loop answering within `loop_deadline` (the supervisor's probe)."""

    async def resync(
        self,
        epoch: int,
        manager,
        peers=(),
        max_batch_tokens: int | None = None,
        pool_limit: int | None = None,
        flush_timeout: float = 30.0,
    ) -> int:
        """Start `epoch`: every request ends, the RAM tier empties; the largest entry id."""

    def release(self, request_id: str) -> None:
        """End a planned request that never ran."""

    def machine(self) -> str:
        """The machine it runs on (its replicas' files are shared there)."""

    def open_events(self, front_end_ip: str) -> EventAddress:
        """Listen for a front end's event stream; where to connect."""

    async def submit(self, req: GenerationRequest, stream: str) -> str:
        """Run `req`, its events on `stream`; "" when taken, else why it is refused."""

    def stop(self, request_id: str) -> None:
        """A stop string ended the text: stop the sequence (its Finished follows)."""

    async def cancel(self, request_id: str) -> None:
        """End a request (the client went away); returns once it ended."""

    async def prompt_end(self, request_id: str, entry_id: int, wait: float) -> str:
        """Store that request's prompt end early for a waiter; how it went, within `wait` s."""

    async def flush_disk(self, timeout: float = 60.0) -> bool:
        """Every queued disk write done within `timeout`."""

    async def step_profile(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """The model loop's step times by phase, for steps that ended in [since, until]."""

    async def prefill_log(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """Each request's prefill timings and the chunk cost fit, received in [since, until]."""

    async def generator_stats(self) -> GeneratorStats:
        """What the replica holds right now."""


@runtime_checkable
class ManagerCalls(Protocol):
    """What the front end calls on the cache manager (engine.actors.cache_manager)."""

    def hello(self, loop_deadline: float = 0.0) -> Hello:
        """Alive (the supervisor's probe)."""

    def resync(self, epoch: int, first_id: int, rescan: bool = True, lost=()) -> None:
        """Start `epoch`: entry ids from `first_id`, the index rebuilt from the files."""

    def attach(self, replicas, machines=None) -> None:
        """The model replicas' handles, and the machine each runs on."""

    def plan(self, req: PlanRequest) -> RestorePlan:
        """Where a request runs and what it restores and captures."""

    def prefilled(self, request_id: str) -> None:
        """The request's prefill ended (its session may be planned again)."""

    def release(self, release: Release, replica: int | None = 0) -> Orders:
        """A request ended without a commit."""

    def lost(self, replica: int) -> None:
        """A replica died: its RAM entries are gone."""

    def revived(
        self,
        replica: int,
        restarted: bool = False,
        epoch: int | None = None,
        machine: str | None = None,
    ) -> None:
        """Route to `replica` again, reset in `epoch`."""

    def alive(self) -> list[int]:
        """The replicas plans go to."""

    def stats(self) -> CacheStats:
        """The cache's figures."""

    def anchors(self) -> list[AnchorUse]:
        """The anchors held, and their use."""

    def tree(self, namespace: str | None = None) -> CacheTree:
        """The cache as plain data (one namespace's, or every one's)."""
