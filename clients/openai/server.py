"""The OpenAI bridge as a running server: uvicorn in the caller's event loop.

`start_bridge(...)` binds and serves the app of clients.openai.app inside the
running loop (`lineage serve --http-port`); `run_bridge(...)` is the blocking
job of `lineage bridge`, until SIGINT/SIGTERM. TLS and tokens come as a
BridgeSecurity (clients.openai.guard), made from the engine's settings by
`bridge_security`; the served model names and the response store's place and
bounds as BridgeOptions (clients.openai.app), by `bridge_options`.
"""

import asyncio
import contextlib
import signal
import socket
from dataclasses import dataclass

from clients.client import DEFAULT_SERVER
from clients.openai.app import BridgeOptions, create_app
from clients.openai.guard import BridgeSecurity
from clients.openai.models import ServedModels

# --------------------------------------------------------------- running ----


@dataclass
class BridgeHandle:
    """A bridge serving in the running event loop."""

    server: object  # uvicorn.Server
    task: asyncio.Task
    backend: object  # clients.openai.backend.Backend
    store: object  # clients.openai.response_store.ResponseStore
    host: str
    port: int
    tls: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def stop(self, grace: float = 2.0) -> None:
        """Stop accepting, give open requests `grace` seconds, close the gRPC channels."""
        self.server.config.timeout_graceful_shutdown = grace
        self.server.should_exit = True
        try:
            await self.task
        finally:
            await self.backend.close()
            await asyncio.to_thread(self.store.close)


async def start_bridge(
    engine,
    host: str,
    port: int,
    security: BridgeSecurity | None = None,
    options: BridgeOptions | None = None,
) -> BridgeHandle:
    """Serve the bridge on host:port (0: any free port) inside the running loop, in front of
    `engine` (a gRPC address, or a backend: clients.openai.app.create_app).

    The socket is bound here, so a taken port raises OSError to the caller.
    Signals stay with the caller's loop (`lineage serve` owns SIGINT/SIGTERM).
    `security` adds tokens (401 without one) and TLS (mTLS with a client CA);
    `options` the served model names and the response store.
    """
    import uvicorn

    security = security or BridgeSecurity()
    app = create_app(engine, security, options)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", **security.uvicorn_options()
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # uvicorn would take over SIGINT/SIGTERM
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            sock.close()
            app.state.store.close()
            task.result()
            raise RuntimeError("the HTTP bridge stopped while starting")
        await asyncio.sleep(0.01)
    port = sock.getsockname()[1]
    backend, store = app.state.backend, app.state.store
    return BridgeHandle(server, task, backend, store, host, port, bool(security.tls_cert))


def bridge_security(server, limits=None) -> BridgeSecurity:
    """The bridge's gate from the engine's ServerConfig (tokens and TLS files) and Limits
    (its body cap)."""
    return BridgeSecurity(
        {i.token: i.namespace for i in server.tokens},
        server.tls_cert,
        server.tls_key,
        server.tls_client_ca,
        **({"max_body_bytes": limits.max_body_bytes} if limits is not None else {}),
    )


def bridge_options(config) -> BridgeOptions:
    """The bridge's model names and response store from the engine's EngineConfig: the
    store under the cache directory, in `responses/`."""
    from pathlib import Path

    from engine.config import default_cache_dir

    server = config.server
    cache_dir = Path(config.cache.cache_dir) if config.cache.cache_dir else default_cache_dir()
    return BridgeOptions(
        ServedModels(server.served_model_name, server.model_alias),
        str(cache_dir / "responses"),
        server.responses_max,
        server.responses_max_bytes,
    )


async def _serve_until_signal(
    grpc_address: str,
    host: str,
    port: int,
    security: BridgeSecurity | None = None,
    options: BridgeOptions | None = None,
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    handle = await start_bridge(grpc_address, host, port, security, options)
    print(
        f"lineage: OpenAI-compatible bridge on {handle.url}/v1 for engine {grpc_address}",
        flush=True,
    )
    await stop.wait()
    print("lineage: stopping the bridge", flush=True)
    await handle.stop()
    return 0


def run_bridge(
    grpc_address: str = DEFAULT_SERVER,
    host: str = "127.0.0.1",
    port: int = 8000,
    security: BridgeSecurity | None = None,
    options: BridgeOptions | None = None,
) -> int:
    """The blocking job of `lineage bridge`: serve until SIGINT/SIGTERM. Returns the exit code."""
    return asyncio.run(_serve_until_signal(grpc_address, host, port, security, options))
