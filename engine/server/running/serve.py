"""`lineage serve`'s engine: Ray's actors and the gRPC server, started and stopped together.

`start_engine(config)` builds a running engine inside an initialized Ray (the
tests use it with their session-wide Ray; `lineage serve` with the Ray it
starts or joins, engine.server.running.lifecycle): the model replicas, the memory
shares once the weights are known (engine.config.share_memory), the cache
manager, the supervisor (engine.server.supervision.supervisor: restarts, epochs, health)
and the gRPC server; a start that fails kills the actors it made.
`RunningEngine.stop` stops them within a deadline whatever died first (health
NOT_SERVING, in-flight streams end with UNAVAILABLE, disk writes flushed,
actors killed: engine.server.running.stopping).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import ray

from engine.config import EngineConfig, format_bytes
from engine.config.declare import label_of
from engine.server.running.stopping import release_actors

log = logging.getLogger("lineage")


@dataclass
class RunningEngine:
    server: object
    port: int
    health: object
    frontend: object
    replicas: list  # ModelActor handles, by replica number
    manager: object
    info: object
    namespace: str = "lineage"  # the Ray namespace the actors are named in
    names: tuple = ()  # their names
    supervisor: object = None  # engine.server.supervision.supervisor.Supervisor
    memory: object = None  # the MemoryShares the actors were given
    sampler: object = None  # the metrics sampling task
    local_socket: str | None = None  # gRPC on this Unix socket too (a sidecar's way in)
    auth: object = None  # the Authenticator the gRPC server checks tokens with
    exact_figures: bool = True  # cached-token figures sent to clients unrounded
    fleet: object = None  # engine.server.running.fleet.Fleet, when several models are served

    @property
    def model(self):
        """The first replica."""
        return self.replicas[0]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float = 2.0, within: float = 60.0) -> bool:
        """Stop serving, then the actors, within `within` seconds whatever is gone first.

        Health NOT_SERVING, in-flight streams end with UNAVAILABLE, queued disk-tier
        writes land, the actors are killed and give up their names (off the loop:
        engine.server.running.stopping). False when a step was left waiting on Ray at the
        deadline: the caller must not wait for Ray again (serve.run ends the process).
        """
        from engine.server.rpc.service import stop_server

        loop = asyncio.get_running_loop()
        end = loop.time() + within

        def left(at_most: float = within) -> float:
            return max(0.1, min(at_most, end - loop.time()))

        if self.fleet is not None:  # each model's calls end UNAVAILABLE, then its actors go
            try:
                stopped = self.fleet.stop(
                    lambda: stop_server(self.server, self.health, None, grace), left()
                )
                return await asyncio.wait_for(stopped, left())
            except asyncio.TimeoutError:
                log.error("the models did not stop within %.1f s", within)
                return False
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.sampler is not None:
            self.sampler.cancel()
        clean = True
        try:
            await asyncio.wait_for(
                stop_server(self.server, self.health, self.frontend, grace), left(grace + 2)
            )
        except asyncio.TimeoutError:
            log.error("the gRPC server did not stop within %.1f s", grace + 2)
            clean = False
        released = await release(self.replicas, self.manager, self.namespace, self.names, left())
        return released and clean


class StartError(ValueError):
    """The engine cannot start for a reason its operator fixes (a port, a name taken):
    `lineage serve` says it in one line and exits 2."""


@dataclass
class _Started:
    """What a start has made so far: stopped again if it fails."""

    actors: list = dataclasses.field(default_factory=list)
    names: tuple = ()
    supervisors: list = dataclasses.field(default_factory=list)
    server: object = None


async def start_engine(
    config: EngineConfig, port: int | None = None, local_socket: str | None = None
) -> RunningEngine:
    """Create the actors and serve gRPC; Ray must already be initialized.

    `local_socket` also serves gRPC on that Unix socket (no TLS; tokens apply).
    A start that fails or is cancelled (a stop signal while the model loads)
    kills the actors it made before it raises. StartError: a port or an actor
    name is taken. With several models declared (engine.config.fleet) each is a
    ModelGroup of its own, loaded and unloaded by an engine.server.running.fleet.Fleet
    behind the one gRPC server; the engine's `frontend`, `replicas` and `manager`
    are the first loaded model's.
    """
    started = _Started()
    try:
        return await _start(config, port, local_socket, started)
    except BaseException:
        for supervisor in started.supervisors:
            supervisor.stop()
        if started.server is not None:
            await started.server.stop(None)
        if started.actors:
            namespace = config.server.ray_namespace
            await release_actors(started.actors, namespace, started.names, 15)
        raise


# Ray keeps an event in its GCS for every actor call unless told not to (by default up to
# 100k of them, a few KB each), and the engine never reads them: under steady traffic
# (requests, supervisor pings, stats) the GCS's memory grew with every call toward that cap.
ACTOR_OPTIONS = {"enable_task_events": False}


def _actor_names(replicas: int) -> tuple[str, ...]:
    from engine.actors.names import CACHE_MANAGER, model_actor_name

    return (*(model_actor_name(r) for r in range(replicas)), CACHE_MANAGER)


async def _start(config: EngineConfig, port, local_socket, started: _Started) -> RunningEngine:
    from functools import partial

    from grpc_health.v1 import health

    from engine.server.rpc.service import create_server, set_serving
    from engine.server.security.auth import Authenticator

    # The supervisor drives health from its first check on; stop() stops it first.
    health_servicer = health.aio.HealthServicer()
    await set_serving(health_servicer, True)
    fleet = None
    if config.fleet.several:
        from engine.server.running.fleet import Fleet

        fleet = Fleet(
            config, partial(start_group, started=started), partial(set_serving, health_servicer)
        )
        await fleet.start()
        group = fleet.first_loaded()
    else:
        group = await start_group(config, partial(set_serving, health_servicer), started=started)
    port = config.server.port if port is None else port
    try:
        server, bound, _ = await create_server(
            group.frontend,
            config.server.host,
            port,
            security=config.server,
            local_socket=local_socket,
            max_concurrent_rpcs=config.server.max_concurrent_rpcs or config.model.max_queue + 64,
            health_servicer=health_servicer,
            fleet=fleet,
        )
    except (RuntimeError, OSError) as error:  # grpc's "Failed to bind to address ..."
        group.frontend.close()
        group.frontend.prompt_thread.shutdown(wait=False)
        flag = label_of(type(config.server), "port")
        first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise StartError(f"{flag}: cannot listen on {config.server.host}:{port}: {first}")
    started.server = server
    engine = RunningEngine(
        server,
        bound,
        health_servicer,
        group.frontend,
        group.replicas,
        group.manager,
        group.info,
        group.namespace,
        group.names,
        group.supervisor,
        group.memory,
        local_socket=local_socket,
        auth=Authenticator(config.server.tokens),
        exact_figures=config.server.exact_cache_figures,
        fleet=fleet,
    )
    engine.sampler = group.sampler
    return engine


@dataclass
class ModelGroup:
    """One model's actors and its front end: the replicas, the cache manager, the
    supervisor, the memory shares they were given and the metrics sampler."""

    frontend: object
    replicas: list  # ModelActor handles, by replica number
    manager: object
    info: object
    namespace: str
    names: tuple
    supervisor: object
    memory: object
    sampler: object = None

    async def stop(self, within: float = 60.0) -> bool:
        """Its calls end UNAVAILABLE, queued disk writes land, its actors are killed, within
        `within` seconds (False: a step was left waiting on Ray)."""
        self.supervisor.stop()
        if self.sampler is not None:
            self.sampler.cancel()
        self.frontend.close()
        self.frontend.prompt_thread.shutdown(wait=False)
        return await release(self.replicas, self.manager, self.namespace, self.names, within)


async def release(replicas, manager, namespace: str, names: Sequence[str], within: float) -> bool:
    """Flush each replica's disk tier, then kill the actors and wait for their names, all
    within `within` seconds (engine.server.running.stopping); False when Ray kept a step waiting."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within

    def left(at_most: float = within) -> float:
        return max(0.1, min(at_most, end - loop.time()))

    # Queued disk-tier writes land before the actors go.
    for flush in [model.flush_disk.remote(60) for model in replicas]:
        try:
            await asyncio.wait_for(flush, left(70))
        except asyncio.TimeoutError:
            log.error("a replica's disk tier did not flush in time: its queued writes are lost")
        except Exception:
            log.exception("flushing the disk tier failed")
    return await release_actors((*replicas, manager), namespace, names, left())


async def start_group(
    config: EngineConfig,
    set_serving: Callable,
    label: str | None = None,
    placement: Mapping[str, float] | None = None,
    started: _Started | None = None,
) -> ModelGroup:
    """One model's replicas, memory shares, cache manager, supervisor and front end.

    `set_serving(up)` is how its supervisor reports health; `label` tags its
    metrics (default: the model directory's name); `placement` adds the Ray
    resources its replicas need (a cluster places them on the nodes that have them).
    """
    placement = placement or {}
    started = started if started is not None else _Started()  # what a failed start stops
    from pathlib import Path

    from mlx_lm.utils import load_tokenizer

    from engine.actors.cache_manager import CacheManagerActor
    from engine.actors.model import ModelActor
    from engine.config import share_memory, with_memory
    from engine.server.front.frontend import Frontend
    from engine.server.observe.activity import NamespaceTags
    from engine.server.observe.metrics import EngineMetrics
    from engine.server.prompts.prompt import PromptBuilder
    from engine.server.supervision.supervisor import Supervisor

    namespace = config.server.ray_namespace
    count = replica_count(config, placement)
    names = _actor_names(count)
    _check_names_free(namespace, names)
    # On a cluster with `mlx` resources, each replica takes one (one per machine or GPU).
    mlx = ray.cluster_resources().get("mlx", 0) >= count or config.server.address
    resources = {"mlx": 1} if mlx else {}
    resources.update(placement)  # a model's own (--model NAME=PATH,resource=R)
    options = {"resources": resources} if resources else {}
    restarts = {"max_restarts": config.server.max_restarts, **ACTOR_OPTIONS}
    shipped = without_tokens(config)
    replicas = [
        ModelActor.options(name=names[r], namespace=namespace, **restarts, **options).remote(
            shipped, r
        )
        for r in range(count)
    ]
    started.actors += replicas
    started.names = names
    infos = await asyncio.gather(*(m.info.remote() for m in replicas))
    info = infos[0]
    # Replicas of one machine share its cache directory (the manager routes files by
    # machine) and its memory: each loads its own weights.
    machines = await asyncio.gather(*(m.machine.remote() for m in replicas))
    per_machine = max(Counter(machines).values())
    memory = share_memory(
        config,
        info.weights_bytes,
        info.kv_bytes_per_token,
        info.max_context,
        replicas=per_machine,
        draft=info.draft_bytes,
    )
    config = with_memory(config, memory)
    _log_memory(memory)
    config = dataclasses.replace(config, cache=measured_guard(config.cache, info))
    manager = CacheManagerActor.options(name=names[-1], namespace=namespace, **restarts).remote(
        config.cache,
        info.fingerprint,
        info.has_state_layers,
        count,
        config.server.route_threshold,
        config.server.malloc_trim_s,
    )
    started.actors.append(manager)
    supervisor = Supervisor(replicas, manager, config, set_serving)
    started.supervisors.append(supervisor)
    await supervisor.start()
    await manager.attach.remote(replicas, machines)
    tokenizer = load_tokenizer(Path(info.path))
    builder = PromptBuilder(
        tokenizer,
        info.vocab_size,
        info.max_context,
        config.cache.anchor_slack,
        limits=config.limits,
        prompt=config.prompt,
    )
    budgets = {
        "ram": config.cache.ram_budget,
        "anchors": config.cache.anchor_max_bytes,
        "disk": config.cache.disk_budget if config.cache.mode != "off" else 0,
    }
    frontend = Frontend(
        replicas,
        manager,
        builder,
        info,
        config,
        supervisor,
        budgets=budgets,
        namespaces=NamespaceTags(config.server.metrics_namespace, config.server.metrics_namespaces),
        metrics=EngineMetrics(namespace, label or Path(info.path).name or info.model_type, memory),
        name=label or Path(info.path).name,
        memory=memory,
    )
    group = ModelGroup(frontend, replicas, manager, info, namespace, names, supervisor, memory)
    group.sampler = asyncio.ensure_future(sample_metrics(frontend))
    return group


async def sample_metrics(frontend, every: float = 1.0) -> None:
    """Gauges and cumulative counters of a front end's live figures, about once a second."""
    while True:
        await asyncio.sleep(every)
        try:
            frontend.metrics.sample(await frontend.inspect(recent=0))
            frontend.metrics.analysis(frontend.builder.renders.failures)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an actor that is gone: the supervisor reports it
            log.debug("sampling metrics failed: %s", e)


def without_tokens(config: EngineConfig) -> EngineConfig:
    """The configuration an actor gets: no token. The actors check none, and Ray keeps an
    actor's arguments in its GCS (to restart it), where every worker could read them."""
    return config.with_server(tokens=())


def loopback_ray() -> None:
    """Have the Ray this process starts listen on 127.0.0.1 alone: its GCS, raylet,
    workers, metrics exporter and dashboard agent, which otherwise listen on every
    interface (the exporter serves each namespace's token counts; the GCS takes jobs).

    Ray does this by itself where it allows no cluster (macOS, Windows); its
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 asks for the same on Linux. Ray reads the
    variable once, when first imported, so its constant is set as well.
    """
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # and for the processes it starts
    ray_constants.ENABLE_RAY_CLUSTER = False


def measured_guard(cache, info):
    """The cache config with its guard threshold from the model's measured costs, unless
    one was given (--guard-min-suffix)."""
    if cache.guard_min_suffix is not None:
        return cache
    log.info(
        "guard threshold %d tokens: a forward costs %.2f ms beyond its tokens, a token %.4f ms",
        info.guard_min_suffix,
        info.forward_ms,
        info.token_ms,
    )
    return dataclasses.replace(cache, guard_min_suffix=info.guard_min_suffix)


def _log_memory(memory) -> None:
    log.info(
        "memory: limit %s = weights %s x %d + running KV %s (%d tokens per replica) "
        "+ RAM tier %s + pool %s x %d + grammars %s x %d + draft model %s x %d",
        format_bytes(memory.limit),
        format_bytes(memory.weights),
        memory.replicas,
        format_bytes(memory.running_kv),
        memory.max_batch_tokens,
        format_bytes(memory.ram_budget),
        format_bytes(memory.pool_limit),
        memory.replicas,
        format_bytes(memory.grammars),
        memory.replicas,
        format_bytes(memory.draft),
        memory.replicas,
    )
    if memory.total > memory.limit:
        log.warning(
            "the configured budgets (%s) exceed the memory limit (%s)",
            format_bytes(memory.total),
            format_bytes(memory.limit),
        )


def _check_names_free(namespace: str, names: Sequence[str]) -> None:
    """StartError naming the namespace when another engine's actors hold these names."""
    for name in names:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            continue
        raise StartError(
            f"an actor named {name!r} already runs in Ray namespace {namespace!r}: another "
            "engine serves there; give this one its own (--ray-namespace, LINEAGE_RAY_NAMESPACE)"
        )


def replica_count(config: EngineConfig, placement: Mapping[str, float] | None = None) -> int:
    """`--replicas`: the number given, or one per `mlx` resource of the cluster (at least 1);
    a model placed by resources (`placement`): as many as the cluster has room for."""
    if config.server.replicas != "auto":
        return int(config.server.replicas)
    cluster = ray.cluster_resources()
    count = int(cluster.get("mlx", 0))
    for resource, amount in (placement or {}).items():
        count = min(count or 1 << 30, int(cluster.get(resource, 0) // amount))
    return max(1, count)


# Tasks whose events a local Ray's GCS keeps (Ray's default: 100,000; measured, ~3.5 KiB
# each: a GCS under 40 calls/s grew 25 -> 95 MiB in 8 minutes, with this cap stayed at 34).
TASK_EVENTS_IN_GCS = 1000
# Profile events (`ray timeline`'s spans) a local Ray keeps per task: none. The driver's
# own task gets a `submit_task` span for every actor call it makes, whatever
# ACTOR_OPTIONS says, and Ray's GCS kept the last 1,000 of each task's (measured: the
# GCS's live heap grew ~1 MiB over a soak's first 15 minutes, a 48 MiB GCS, by these).
PROFILE_EVENTS_PER_TASK = 0


# jemalloc's settings for the GCS and raylet of a local Ray. Ray preloads its jemalloc into
# both with jemalloc's defaults: a cache per thread (~30 threads each, most of them idle
# most of the time), four arenas per core, free pages given back only when the arena that
# freed them allocates again. Their live heaps stay flat (jemalloc heap profiles through a
# soak: GCS ~19 MiB, raylet ~5 MiB) while the thread caches fill (~6 MiB in each) and pin
# partly free pages: resident memory crept up for as long as they ran. Measured, two Rays
# side by side for 12 minutes on the engine's calls (jemalloc's own totals): with these,
# the GCS's own memory 20.4 MiB and flat (+0.4 MiB/h over minutes 8-12), the raylet's 7.1
# MiB and flat (+0.9); with jemalloc's defaults 27.1 (+3.2 MiB/h over minutes 4-12) and
# 14.4 (+9.5, still climbing). The cost: the raylet's CPU 4.9 s against 4.5 in 10 minutes.
RAY_JEMALLOC = "narenas:2,background_thread:true,tcache:false"
# glibc malloc's settings for a local Ray's Python workers (read by glibc as each starts).
# MLX's CPU buffers and the tiers' arrays come from malloc, from several threads; glibc
# raises its mmap threshold to the largest block freed (up to 32 MiB), after which
# KV-sized blocks come from the heap and the threads' arenas and stay there, fragmented,
# once freed. Measured, two soaks side by side on the embedded model (RssAnon of the model
# actor): glibc's defaults 147 -> 184 MiB over its first 6 minutes, a fill that levelled
# near 172; with these 119 -> 125, 50-60 MiB less all along.
WORKER_MALLOC = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
# What runs Ray's GCS or raylet under gdb, valgrind or a profiler (Ray's own switches).
RAY_DEBUG_TOOLS = tuple(
    f"RAY_{process}_{tool}"
    for process in ("GCS_SERVER", "RAYLET")
    for tool in ("GDB", "VALGRIND", "VALGRIND_PROFILER", "PERFTOOLS_PROFILER")
)


def ray_environment(config: EngineConfig) -> dict[str, str]:
    """What `lineage serve` sets in its environment before it starts a local Ray: glibc
    malloc's settings for the Python workers it starts (WORKER_MALLOC: the model actor, the
    cache manager), each where the environment does not set it already, and the jemalloc
    settings (RAY_JEMALLOC) Ray hands its GCS and raylet. Ray passes RAY_JEMALLOC_CONF as
    MALLOC_CONF to the processes RAY_JEMALLOC_PROFILE names (its hook for jemalloc's heap
    profiling, the only one per process). Nothing for a cluster the serve joins (its nodes'
    `ray start` environment is theirs: cluster.yaml); no jemalloc settings where the
    environment already sets either variable or preloads a library of its own
    (LD_PRELOAD: Ray then preloads no jemalloc), nor where it runs the GCS or the raylet
    under one of Ray's debugging tools (RAY_DEBUG_TOOLS: Ray refuses to start one with two
    of them, and counts these settings as its jemalloc profiler)."""
    if config.server.address is not None:
        return {}
    env = {k: v for k, v in WORKER_MALLOC.items() if k not in os.environ}
    if any(os.environ.get(k) for k in ("RAY_JEMALLOC_CONF", "RAY_JEMALLOC_PROFILE", "LD_PRELOAD")):
        return env
    if any(os.environ.get(k) == "1" for k in RAY_DEBUG_TOOLS):
        return env
    return env | {"RAY_JEMALLOC_CONF": RAY_JEMALLOC, "RAY_JEMALLOC_PROFILE": "gcs_server,raylet"}


def ray_address_warning(config: EngineConfig, environ: Mapping[str, str]) -> str | None:
    """What `lineage serve` warns where RAY_ADDRESS names a cluster it will not join (no
    address given: a Ray of its own, ray_options); None where nothing is ignored."""
    if config.server.address or not environ.get("RAY_ADDRESS"):
        return None
    return (
        "RAY_ADDRESS is set; lineage serve starts a Ray of its own: join a cluster with "
        + label_of(type(config.server), "address")
    )


def ray_options(config: EngineConfig) -> dict:
    """`ray.init`'s keyword arguments for `lineage serve` (a local Ray, or the cluster's).

    A local Ray starts only what the engine uses: no dashboard unless asked
    (`--ray-dashboard`; the metrics agent runs without it), and no idle
    workers started ahead for tasks (the engine runs actors only, each in a
    process of its own): idle, those take a share of a core and a GiB or so.
    Its actors run at the front end's priority: Ray starts workers at nice 15
    (`worker_niceness`), and a model actor at 15 gets a few percent of a core
    whenever a process at 0 wants it (the front end, a client, anything else
    on the machine), so its decode stalls behind them.
    Its GCS keeps the events of the last TASK_EVENTS_IN_GCS tasks (what `ray
    list tasks` and the dashboard's task views show), not Ray's 100,000 at a
    few KiB each: the engine's actors leave none (ACTOR_OPTIONS), and this
    bounds what any other task leaves (a driver's, a tool's) in a serve left
    running for days. It keeps no profile events (PROFILE_EVENTS_PER_TASK):
    `ray timeline` shows none of a serve's.
    Without `--metrics-port` a local Ray records no metrics
    (`enable_metrics_collection` off): nobody reads them then, and Ray's own
    recording grows the raylet's memory for as long as it runs (measured: an
    idle raylet 13.0 -> 16.2 MiB in 20 minutes with it, flat after 16 without;
    ray-project/ray#50955, #35632). The engine's own metrics
    (engine.server.observe.metrics) are then recorded nowhere, without a warning.
    A local Ray is always one of its own (address "local"): `ray.init()` without an address
    joins the cluster named in Ray's temp dir (ray_current_cluster, written by `ray start`
    and by ray.cluster_utils.Cluster, left behind when either dies) or in RAY_ADDRESS, and
    then refuses the settings above: the serve would not start, or would start elsewhere.
    """
    options = dict(
        address=config.server.address or "local",
        num_cpus=config.server.num_cpus,
        include_dashboard=config.server.ray_dashboard,
        dashboard_host="127.0.0.1",
        configure_logging=False,
        log_to_driver=True,
        namespace=config.server.ray_namespace,
    )
    if config.server.metrics_port:  # this node's metrics agent serves Prometheus text
        options["_metrics_export_port"] = config.server.metrics_port
    if config.server.address is None:  # a cluster we join keeps its own settings
        options["_system_config"] = {
            "prestart_worker_first_driver": False,
            "worker_niceness": 0,
            "task_events_max_num_task_in_gcs": TASK_EVENTS_IN_GCS,
            "task_events_max_num_profile_events_per_task": PROFILE_EVENTS_PER_TASK,
        }
        if not config.server.metrics_port:
            options["_system_config"]["enable_metrics_collection"] = False
    return options
