"""Several models behind one server: routed by name, loaded and unloaded within one memory limit.

Each declared model (engine.config.fleet) is a ModelGroup of its own
(engine.server.running.serve `start_group`): its replicas, its cache manager (its own
index, RAM tier and disk directory, so an entry of one model is never offered
to another), its supervisor and its Frontend. The Fleet routes a request by the
model it names (a served name, or a `--model-alias` pattern), loads a model
that is not loaded while the request waits (a Progress event about once a
second keeps its stream alive), and unloads:

- the least recently used model that is loaded, not pinned and serves no
  request, when the memory limit has no room for the model asked for (each
  model's share is its memory shares' total: weights, running KV, RAM tier, pool);
- a model nobody asked for in `--idle-unload` seconds, unless pinned.

Unloading flushes the model's queued disk-tier writes (every RAM-tier entry
has its disk file), then kills its actors, so their memory returns to the
machine and the model's conversations restore from disk when it loads again.
It knows the groups' front ends and the configuration; nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from engine.config import EngineConfig, ModelSpec, format_bytes, machine_memory, share_memory
from engine.config.fleet import alias_targets, routed
from engine.runtime.events import Progress
from engine.server.errors import Overloaded, Unavailable, UnknownModel
from engine.server.rpc.replies import model_name

log = logging.getLogger("lineage.fleet")

LOADED, LOADING, UNLOADED, UNLOADING = "loaded", "loading", "unloaded", "unloading"
PING_S = 1.0  # a loading request's Progress events, this often
ROOM_WAIT_S = 0.25  # how often a load that needs a busy model's room looks again


@dataclass(eq=False)
class Member:
    """One declared model: its tree, names, and its group while loaded."""

    spec: ModelSpec
    config: EngineConfig
    aliases: tuple[str, ...]
    pinned: bool
    share: int  # bytes of the memory limit it takes when loaded (estimated until loaded)
    group: object = None  # engine.server.running.serve.ModelGroup
    state: str = UNLOADED
    loading: asyncio.Task | None = None
    active: int = 0  # requests routed to it and not yet ended
    announced: tuple[str, int] | None = None  # (output format, context), once known
    last_used: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.spec.name


StartGroup = Callable[..., Awaitable[object]]


class Fleet:
    """The declared models, by name; `generate_events` is a call's way in."""

    def __init__(self, config: EngineConfig, start_group: StartGroup, set_serving: Callable):
        names = tuple(m.name for m in config.fleet.models)
        targets = alias_targets(config.server.model_alias, names)
        self.limit = config.cache.memory_limit or machine_memory() * 3 // 4
        self.idle_unload = config.fleet.idle_unload
        self.deadline = config.server.call_deadline
        self.limits = config.limits
        self._start_group = start_group
        self._set_serving = set_serving
        self._health: dict[str, bool] = {}
        self._lock = asyncio.Lock()  # one load or unload at a time
        self._idle: asyncio.Task | None = None
        self.members: dict[str, Member] = {}
        for spec in config.fleet.models:
            tree = config.for_model(spec)
            if config.cache.ram_budget_auto:  # defaults: every model fits beside the others
                tree = tree.with_cache(memory_limit=self.limit // len(names))
            aliases = tuple(p for p, target in targets.items() if target == spec.name)
            pinned = spec.name in config.fleet.pin
            self.members[spec.name] = Member(spec, tree, aliases, pinned, _estimate(tree))

    # -- routing -------------------------------------------------------------------------

    def resolve(self, requested: str) -> Member:
        """The model a requested name goes to (engine.config.fleet `routed`); UnknownModel
        naming the models and their states when none does."""
        patterns = [(p, m.name) for m in self.members.values() for p in m.aliases]
        name = routed(requested, self.members, patterns)
        if name is None:
            known = ", ".join(f"{m.name} ({m.state})" for m in self.members.values())
            raise UnknownModel(f"model {requested!r} is not served here; served models: {known}")
        return self.members[name]

    def listing(self) -> list:
        """Every model as ModelInfoReply's ServedModel: name, state, aliases and, loaded, its
        directory's name, output format and context."""
        from engine.proto import engine_pb2

        out = []
        for m in self.members.values():
            output_format, max_context = m.announced or (_announced(m.config), 0)
            m.announced = m.announced or (output_format, 0)
            out.append(
                engine_pb2.ServedModel(
                    name=m.name,
                    state=m.state,
                    aliases=list(m.aliases),
                    model=model_name(m.spec.path or "embedded"),
                    output_format=output_format,
                    max_context=max_context,
                )
            )
        return out

    def summary(self) -> str:
        """One line: each model, its state, the patterns routed to it, pinned or not."""
        return "; ".join(
            f"{m.name} ({m.state}{', pinned' if m.pinned else ''}"
            f"{', aliases ' + ' '.join(m.aliases) if m.aliases else ''})"
            for m in self.members.values()
        )

    def frontend_of(self, requested: str = ""):
        """A model's front end, for its figures: the named model's (UnknownModel,
        Unavailable when it is not loaded), or the first loaded one's."""
        if not requested:
            return self.first_loaded().frontend
        member = self.resolve(requested)
        if member.group is None or member.state != LOADED:
            raise Unavailable(f"model {member.name} is {member.state}")
        return member.group.frontend

    def first_loaded(self):
        """The first declared model's group that is loaded (Unavailable when none is)."""
        for m in self.members.values():
            if m.group is not None and m.state == LOADED:
                return m.group
        raise Unavailable("no model is loaded")

    async def generate_events(self, auth, request, metadata):
        """A Generate call on the model it names: loaded first if need be (Progress events
        meanwhile), then as engine.server.rpc.service `generate_events` runs it."""
        from engine.server.rpc.service import generate_events

        member = self.resolve(request.model)
        member.active += 1
        member.last_used = time.monotonic()
        try:
            if member.state != LOADED:
                loading = asyncio.ensure_future(self._ensure_loaded(member))
                while not loading.done():
                    await asyncio.wait({loading}, timeout=PING_S)
                    if not loading.done():
                        yield [Progress(done=0, total=0)]
                loading.result()
            events = generate_events(member.group.frontend, auth, request, metadata)
            async for batch in events:
                yield batch
        finally:
            member.active -= 1
            member.last_used = time.monotonic()

    # -- loading and unloading -----------------------------------------------------------

    async def start(self) -> None:
        """Load the pinned models, then the others in their order while they fit."""
        order = sorted(self.members.values(), key=lambda m: not m.pinned)
        for member in order:
            if member.pinned or self._used() + member.share <= self.limit:
                await self._ensure_loaded(member)
        if not any(m.state == LOADED for m in self.members.values()):
            await self._ensure_loaded(next(iter(self.members.values())))
        if self.idle_unload:
            self._idle = asyncio.ensure_future(self._unload_idle())

    async def _ensure_loaded(self, member: Member) -> None:
        """Load `member` (once, however many requests wait), making room first."""
        if member.state == LOADED:
            return
        if member.loading is None or member.loading.done():
            member.loading = asyncio.ensure_future(self._load(member))
        await asyncio.shield(member.loading)

    async def _load(self, member: Member) -> None:
        async with self._lock:
            if member.state == LOADED:
                return
            await self._make_room(member)
            member.state = LOADING
            t0 = time.perf_counter()
            try:
                member.group = await self._start_group(
                    member.config,
                    lambda up, name=member.name: self._serving(name, up),
                    member.name,
                    dict(member.spec.resources),
                )
            except BaseException:
                member.state = UNLOADED
                raise
            member.share = member.group.memory.total
            info = member.group.info
            member.announced = (member.group.frontend.builder.output_format, info.max_context)
            member.state = LOADED
            member.last_used = time.monotonic()
            log.info(
                "model %s loaded in %.1f s (its share: %s of %s)",
                member.name,
                time.perf_counter() - t0,
                format_bytes(member.share),
                format_bytes(self.limit),
            )

    async def _make_room(self, member: Member) -> None:
        """Unload the least recently used idle, unpinned models until `member` fits; wait
        for a busy one to finish (up to the call deadline); Overloaded when none can go."""
        deadline = time.monotonic() + self.deadline
        while self._used() + member.share > self.limit:
            loaded = [m for m in self.members.values() if m.state == LOADED and not m.pinned]
            idle = sorted((m for m in loaded if m.active == 0), key=lambda m: m.last_used)
            if idle:
                log.info("model %s unloaded: %s needs its room", idle[0].name, member.name)
                await self._unload(idle[0])
                continue
            if not loaded or time.monotonic() > deadline:
                raise Overloaded(
                    f"model {member.name} needs {format_bytes(member.share)} and the memory "
                    f"limit ({format_bytes(self.limit)}) has no room: the loaded models are "
                    "pinned or busy"
                )
            await asyncio.sleep(ROOM_WAIT_S)

    async def _unload(self, member: Member, within: float = 60.0) -> bool:
        """Its RAM tier flushed to disk, its actors killed (the caller holds the lock), within
        `within` seconds (False: Ray kept a step waiting)."""
        group, member.group = member.group, None
        member.state = UNLOADING
        self._health.pop(member.name, None)
        try:
            return await group.stop(within)
        finally:
            member.state = UNLOADED

    async def _unload_idle(self) -> None:
        """Every so often: unload each loaded, unpinned model idle for --idle-unload."""
        every = min(PING_S, self.idle_unload / 4)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for member in self.members.values():
                idle = member.active == 0 and now - member.last_used >= self.idle_unload
                if member.state == LOADED and idle and not member.pinned:
                    async with self._lock:
                        if member.state == LOADED and member.active == 0:
                            log.info("model %s unloaded: idle", member.name)
                            await self._unload(member)

    def _used(self) -> int:
        return sum(m.share for m in self.members.values() if m.state in (LOADED, LOADING))

    async def _serving(self, name: str, up: bool) -> None:
        """Health: serving while every loaded model's supervisor says so."""
        self._health[name] = up
        await self._set_serving(all(self._health.values()))

    # -- stopping ------------------------------------------------------------------------

    async def stop(self, stop_server: Callable[[], Awaitable[None]], within: float = 60.0) -> bool:
        """Calls in flight end UNAVAILABLE, `stop_server()` runs, every group stops, each within
        `within` seconds (False: Ray kept a step waiting)."""
        if self._idle is not None:
            self._idle.cancel()
        for member in self.members.values():
            if member.loading is not None:
                member.loading.cancel()
            if member.group is not None:
                member.group.frontend.close()
        await stop_server()
        clean = True
        for member in self.members.values():
            if member.group is not None:
                clean = await self._unload(member, within) and clean
        return clean


def _announced(config: EngineConfig) -> str:
    """The output format a model not loaded yet announces, from its tokenizer alone (as
    engine.server.prompts.prompt decides it at load)."""
    from mlx_lm.utils import load_tokenizer

    from engine.server.prompts.output_format import output_format
    from engine.server.prompts.renders import TemplateRenders

    if config.prompt.output_format != "auto":
        return config.prompt.output_format
    path = config.model.path
    if path is None:
        from engine.runtime.model.tiny_models import ensure_default_model

        path = ensure_default_model(Path(config.cache.resolved_cache_dir))
    tokenizer = load_tokenizer(Path(path))
    renders = TemplateRenders(tokenizer)
    return output_format(
        "auto", tokenizer, lambda messages: renders.analysis("probe", messages, None, True)
    )


def _estimate(config: EngineConfig) -> int:
    """A model's memory shares before it is loaded: its weight files' size, a KV byte per
    token (the measured shares replace it once loaded)."""
    path = Path(config.model.path) if config.model.path else None
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors")) if path else 0
    if path is None:  # the embedded model: a few MB
        weights = 8 << 20
    return share_memory(config, weights, 1, 4096).total
