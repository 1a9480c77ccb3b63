"""The life of `lineage serve`: Ray, the engine and its sidecars, a stop within a deadline.

`run(config)` starts or joins Ray, starts the engine (engine.server.running.serve) and
the sidecars beside it (the OpenAI bridge), serves until SIGINT or SIGTERM,
then stops them and the Ray it started within STOP_WITHIN + RAY_STOP_WITHIN
seconds, whatever died first (engine.server.running.stopping): a terminal's Ctrl-C
and `timeout` signal the whole process group, Ray's processes included. A
signal while the model loads stops the start. A StartError (a port or an
actor name taken) is the operator's to fix: `lineage serve` says it in one
line. The front end's malloc keeps few arenas and gives its free pages back every
`LINEAGE_MALLOC_TRIM_S` (engine.server.running.allocator). With `LINEAGE_HEAP_TRACE`
SIGUSR2 writes a snapshot of the front end's heap (engine.server.observe.heap).
"""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import os
import shutil
import signal
import sys
import tempfile
from typing import Awaitable, Callable, Protocol, Sequence

import ray

from engine.config import EngineConfig
from engine.server.observe import heap
from engine.server.running import allocator
from engine.server.running.serve import (
    RunningEngine,
    StartError,
    loopback_ray,
    ray_address_warning,
    ray_environment,
    ray_options,
    start_engine,
)
from engine.server.running.stopping import end_process, within

log = logging.getLogger("lineage")
EXIT_USAGE = 2  # a StartError: as `lineage`'s usage errors
# The sidecars and the engine stop within STOP_WITHIN seconds of a signal, then Ray within
# RAY_STOP_WITHIN: 10 s in all.
STOP_WITHIN = 5.0
RAY_STOP_WITHIN = 3.0


class Stoppable(Protocol):
    async def stop(self) -> None: ...


# Started beside the engine once it serves (handed the RunningEngine); stopped before it.
Sidecar = Callable[[RunningEngine], Awaitable[Stoppable]]


def run(config: EngineConfig, sidecars: Sequence[Sidecar] = ()) -> int:
    """The main job. Returns the process exit code.

    `sidecars` start beside the engine once it serves (each is handed the
    RunningEngine) and stop before it: `lineage serve --http-port` runs the
    OpenAI bridge this way, from the client side.

    SIGINT or SIGTERM stops it, while the model loads as well, within
    STOP_WITHIN + RAY_STOP_WITHIN seconds whatever died first: a terminal's
    Ctrl-C and `timeout` signal the whole process group, Ray's processes
    included. When a step is left waiting on Ray, the process ends at once
    (engine.server.running.stopping.end_process).
    """
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
        handlers=[log_handler(config)],
    )
    config.server.check_exposure()  # before anything starts
    if config.server.heap_trace:  # before Ray and the engine allocate
        heap.start(config.server.heap_trace)
    allocator.limit_arenas(config.server.malloc_arenas)  # before Ray and gRPC start threads
    trimmer = allocator.Trimmer(config.server.malloc_trim_s)
    trimmer.start()
    started_ray = not ray.is_initialized()
    dashboard = ""
    if started_ray:
        if not config.server.address and not config.server.ray_public:
            loopback_ray()
        os.environ.update(ray_environment(config))
        ignored = ray_address_warning(config, os.environ)
        if ignored:
            log.warning(ignored)
        ctx = ray.init(**ray_options(config))
        dashboard = getattr(ctx, "dashboard_url", "") or ""
    left: list[str] = []  # the stop steps left waiting on Ray
    try:
        status = asyncio.run(_serve(config, dashboard, sidecars, left))
    except BaseException as error:
        trimmer.stop()
        if started_ray and not within(RAY_STOP_WITHIN, ray.shutdown):
            left.append("Ray's shutdown")
        if left:  # the caller would report it, then wait for Ray at exit: report it here
            log.error("lineage serve: %s", error, exc_info=not isinstance(error, StartError))
            end_process(EXIT_USAGE if isinstance(error, StartError) else 1, left)
        raise
    trimmer.stop()
    if started_ray and not within(RAY_STOP_WITHIN, ray.shutdown):
        left.append("Ray's shutdown")
    if left:
        end_process(status, left)
    return status


def log_handler(config: EngineConfig) -> logging.Handler:
    """Where the serve's log goes: stderr, or `--log-file` rotated at `--log-file-bytes`
    with two older files kept, so a server left running for days holds at most three
    times that on disk (stderr's bound is whoever reads it: a terminal, journald)."""
    if config.server.log_file is None:
        return logging.StreamHandler(sys.stderr)
    return logging.handlers.RotatingFileHandler(
        config.server.log_file, maxBytes=config.server.log_file_bytes, backupCount=2
    )


async def _serve(
    config: EngineConfig, dashboard: str, sidecars: Sequence[Sidecar], left: list[str]
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if config.server.heap_trace:
        loop.add_signal_handler(signal.SIGUSR2, heap.write_snapshot, config.server.heap_trace_dir)
    # Sidecars reach the engine on a Unix socket in a private directory: no TLS
    # to verify and no port to guess, whatever the public bind (tokens still apply).
    private = tempfile.mkdtemp(prefix="lineage-") if sidecars else None
    local_socket = os.path.join(private, "grpc.sock") if private else None
    try:
        starting = asyncio.ensure_future(start_engine(config, local_socket=local_socket))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if stop.is_set():  # stopped while the model loads: the start undoes itself
            print("lineage: stopping", flush=True)
            if not starting.done():
                starting.cancel()
                await asyncio.wait({starting}, timeout=STOP_WITHIN)
            if not starting.done():
                left.append("the start")
            elif not starting.cancelled() and starting.exception() is None:  # just started
                if not await _stop_all(starting.result(), [], STOP_WITHIN):
                    left.append("the engine's stop")
            return 0  # a start that failed meanwhile failed for the stop (Ray signalled too)
        engine = starting.result()  # a start that failed raises here
        _announce(config, engine, dashboard)
        handles: list = []
        try:
            for sidecar in sidecars:
                handles.append(await sidecar(engine))
            await stop.wait()
            print("lineage: stopping", flush=True)
        finally:
            if not await _stop_all(engine, handles, STOP_WITHIN):
                left.append("the engine's stop")
        return 0
    finally:
        if private:
            shutil.rmtree(private, ignore_errors=True)


async def _stop_all(engine: RunningEngine, handles: list, seconds: float) -> bool:
    """The sidecars, then the engine, within `seconds`; False when a step was left."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    for handle in reversed(handles):
        try:
            await asyncio.wait_for(handle.stop(), max(0.1, min(3.0, end - loop.time())))
        except asyncio.TimeoutError:
            log.error("a sidecar did not stop in time")
        except Exception:
            log.exception("stopping a sidecar failed")
    return await engine.stop(grace=1.0, within=max(0.5, end - loop.time()))


def _announce(config: EngineConfig, engine: RunningEngine, dashboard: str) -> None:
    """The lines `lineage serve` prints once it serves."""
    print(
        f"lineage: serving {engine.info.model_type} ({engine.info.path}) "
        f"on {config.server.host}:{engine.port}, cache mode {config.cache.mode}, "
        f"kernels {', '.join(engine.info.kernels) or 'none'}, "
        f"output format {engine.frontend.builder.output_format}",
        flush=True,
    )
    if engine.fleet is not None:
        print(f"lineage: models {engine.fleet.summary()}", flush=True)
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
