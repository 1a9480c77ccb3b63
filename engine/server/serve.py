"""`lineage serve`: Ray, the actors, the gRPC server, and a clean stop.

`start_engine(config)` builds a running engine inside an initialized Ray (the
tests use it with their session-wide Ray): the model replicas, the memory plan
once the weights are known (engine.config.plan_memory), the cache manager,
the supervisor (engine.server.supervisor: restarts, epochs, health) and the
gRPC server. `run(config)` is the main job: it
starts or joins Ray, serves until SIGINT/SIGTERM, then stops cleanly (health
NOT_SERVING, in-flight streams end with UNAVAILABLE, actors killed, Ray shut
down if it started it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence

import ray

from engine.config import EngineConfig, format_bytes

log = logging.getLogger("lineage")


class Stoppable(Protocol):
    async def stop(self) -> None: ...


# Started beside the engine once it serves (handed the RunningEngine); stopped before it.
Sidecar = Callable[["RunningEngine"], Awaitable[Stoppable]]


@dataclass
class RunningEngine:
    server: object
    port: int
    health: object
    frontend: object
    models: list  # ModelActor handles, by replica number
    manager: object
    info: object
    namespace: str = "lineage"  # the Ray namespace the actors are named in
    names: tuple = ()  # their names
    supervisor: object = None  # engine.server.supervisor.Supervisor
    memory: object = None  # the MemoryPlan the actors were given
    sampler: object = None  # the metrics sampling task
    local_socket: str | None = None  # gRPC on this Unix socket too (a sidecar's way in)
    auth: object = None  # the Authenticator the gRPC server checks tokens with
    exact_figures: bool = True  # cached-token figures sent to clients unrounded

    @property
    def model(self):
        """The first replica."""
        return self.models[0]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def local_address(self) -> str:
        """The gRPC address a sidecar in this process takes: the Unix socket when there is one."""
        return f"unix:{self.local_socket}" if self.local_socket else self.address

    async def stop(self, grace: float = 2.0) -> None:
        from engine.server.service import stop_server

        if self.supervisor is not None:
            self.supervisor.stop()
        if self.sampler is not None:
            self.sampler.cancel()
        await stop_server(self.server, self.health, self.frontend, grace)
        for model in self.models:
            try:  # queued disk-tier writes land before the actor goes
                await asyncio.wait_for(model.flush_disk.remote(60), 70)
            except Exception:
                log.exception("flushing the disk tier failed")
        for actor in (*self.models, self.manager):
            ray.kill(actor, no_restart=True)
        await _names_released(self.namespace, self.names)


async def _names_released(namespace: str, names: Sequence[str], patience: float = 10.0) -> None:
    """Wait until killed actors give up their names, so an engine restarted at once can
    take them again (`ray.kill` returns before the actor is gone)."""
    deadline = asyncio.get_running_loop().time() + patience
    for name in names:
        while asyncio.get_running_loop().time() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                break
            await asyncio.sleep(0.05)


async def start_engine(
    config: EngineConfig, port: int | None = None, local_socket: str | None = None
) -> RunningEngine:
    """Create the actors and serve gRPC; Ray must already be initialized.

    `local_socket` also serves gRPC on that Unix socket (no TLS; tokens apply).
    """
    from functools import partial
    from pathlib import Path

    from grpc_health.v1 import health
    from mlx_lm.utils import load_tokenizer

    from engine.actors.cache_manager import CacheManagerActor
    from engine.actors.model import ModelActor
    from engine.actors.names import CACHE_MANAGER, model_actor_name
    from engine.config import plan_memory, with_memory
    from engine.server.activity import NamespaceTags
    from engine.server.auth import Authenticator
    from engine.server.frontend import Frontend
    from engine.server.metrics import EngineMetrics
    from engine.server.prompt import PromptBuilder
    from engine.server.service import create_server, set_serving
    from engine.server.supervisor import Supervisor

    namespace = config.server.ray_namespace
    count = replica_count(config)
    names = (*(model_actor_name(r) for r in range(count)), CACHE_MANAGER)
    _check_names_free(namespace, names)
    # On a cluster with `mlx` resources, each replica takes one (one per machine or GPU).
    mlx = ray.cluster_resources().get("mlx", 0) >= count or config.server.address
    options = {"resources": {"mlx": 1}} if mlx else {}
    restarts = {"max_restarts": config.server.max_restarts}
    shipped = without_tokens(config)
    models = [
        ModelActor.options(name=names[r], namespace=namespace, **restarts, **options).remote(
            shipped, r
        )
        for r in range(count)
    ]
    infos = await asyncio.gather(*(m.info.remote() for m in models))
    info = infos[0]
    # Replicas of one machine share its cache directory (the manager routes files by
    # machine) and its memory: each loads its own weights.
    machines = await asyncio.gather(*(m.machine.remote() for m in models))
    per_machine = max(Counter(machines).values())
    memory = plan_memory(
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
    )
    # The supervisor drives health from its first check on; stop() stops it first.
    health_servicer = health.aio.HealthServicer()
    await set_serving(health_servicer, True)
    supervisor = Supervisor(models, manager, config, partial(set_serving, health_servicer))
    await supervisor.start()
    await manager.attach.remote(models, machines)
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
        models,
        manager,
        builder,
        info,
        config,
        supervisor,
        budgets=budgets,
        namespaces=NamespaceTags(config.server.metrics_namespace, config.server.metrics_namespaces),
        metrics=EngineMetrics(namespace, Path(info.path).name or info.model_type, memory),
        memory=memory,
    )
    server, bound, _ = await create_server(
        frontend,
        config.server.host,
        config.server.port if port is None else port,
        security=config.server,
        local_socket=local_socket,
        max_concurrent_rpcs=config.server.max_concurrent_rpcs or config.model.max_queue + 64,
        health_servicer=health_servicer,
    )
    engine = RunningEngine(
        server,
        bound,
        health_servicer,
        frontend,
        models,
        manager,
        info,
        namespace,
        names,
        supervisor,
        memory,
        local_socket=local_socket,
        auth=Authenticator(config.server.tokens),
        exact_figures=config.server.exact_cache_figures,
    )
    engine.sampler = asyncio.ensure_future(sample_metrics(engine))
    return engine


async def sample_metrics(engine: "RunningEngine", every: float = 1.0) -> None:
    """Gauges and cumulative counters from the live figures, about once a second."""
    frontend = engine.frontend
    while True:
        await asyncio.sleep(every)
        try:
            frontend.metrics.sample(await frontend.inspect(recent=0))
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
    """ValueError naming the namespace when another engine's actors hold these names."""
    for name in names:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            continue
        raise ValueError(
            f"an actor named {name!r} already runs in Ray namespace {namespace!r}: another "
            "engine serves there; give this one its own (--ray-namespace, LINEAGE_RAY_NAMESPACE)"
        )


def replica_count(config: EngineConfig) -> int:
    """`--replicas`: the number given, or one per `mlx` resource of the cluster (at least 1)."""
    if config.server.replicas != "auto":
        return int(config.server.replicas)
    return max(1, int(ray.cluster_resources().get("mlx", 0)))


def ray_options(config: EngineConfig) -> dict:
    """`ray.init`'s keyword arguments for `lineage serve` (a local Ray, or the cluster's).

    A local Ray starts only what the engine uses: no dashboard unless asked
    (`--ray-dashboard`; the metrics agent runs without it), and no idle
    workers started ahead for tasks (the engine runs actors only, each in a
    process of its own). On 2 cores these took ~3% of a core and ~1 GiB idle.
    """
    options = dict(
        address=config.server.address,
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
        options["_system_config"] = {"prestart_worker_first_driver": False}
    return options


def run(config: EngineConfig, sidecars: Sequence[Sidecar] = ()) -> int:
    """The main job. Returns the process exit code.

    `sidecars` start beside the engine once it serves (each is handed the
    RunningEngine) and stop before it: `lineage serve --http-port` runs the
    OpenAI bridge this way, from the client side.
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    config.server.check_exposure()  # before anything starts
    started_ray = not ray.is_initialized()
    dashboard = ""
    if started_ray:
        if not config.server.address and not config.server.ray_public:
            loopback_ray()
        ctx = ray.init(**ray_options(config))
        dashboard = getattr(ctx, "dashboard_url", "") or ""
    try:
        return asyncio.run(_serve(config, dashboard, sidecars))
    finally:
        if started_ray:
            ray.shutdown()


async def _serve(config: EngineConfig, dashboard: str, sidecars: Sequence[Sidecar]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Sidecars reach the engine on a Unix socket in a private directory: no TLS
    # to verify and no port to guess, whatever the public bind (tokens still apply).
    private = tempfile.mkdtemp(prefix="lineage-") if sidecars else None
    local_socket = os.path.join(private, "grpc.sock") if private else None
    engine = await start_engine(config, local_socket=local_socket)
    print(
        f"lineage: serving {engine.info.model_type} ({engine.info.path}) "
        f"on {config.server.host}:{engine.port}, cache mode {config.cache.mode}, "
        f"kernels {', '.join(engine.info.kernels) or 'none'}, "
        f"output format {engine.frontend.builder.output_format}",
        flush=True,
    )
    if dashboard:
        url = dashboard if dashboard.startswith("http") else f"http://{dashboard}"
        print(f"lineage: Ray dashboard at {url}", flush=True)
    print(
        f"lineage: actors {', '.join(engine.names)} in Ray namespace {engine.namespace}",
        flush=True,
    )
    if config.server.metrics_port and config.server.address:
        print(
            "lineage: --metrics-port is ignored when joining a cluster: its nodes export "
            "metrics at their `ray start --metrics-export-port`",
            flush=True,
        )
    elif config.server.metrics_port:
        print(
            f"lineage: Prometheus metrics at http://127.0.0.1:{config.server.metrics_port}/metrics",
            flush=True,
        )
    started = []
    for sidecar in sidecars:
        started.append(await sidecar(engine))
    await stop.wait()
    print("lineage: stopping", flush=True)
    for handle in reversed(started):
        await handle.stop()
    await engine.stop()
    if private:
        shutil.rmtree(private, ignore_errors=True)
    return 0
