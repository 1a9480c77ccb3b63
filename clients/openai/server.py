"""The OpenAI bridge as a running server: uvicorn in the caller's event loop.

`start_bridge(...)` binds and serves the app of clients.openai.app inside the
running loop (`lineage serve --http-port`); `run_bridge(...)` is the blocking
job of `lineage bridge`, until SIGINT/SIGTERM. TLS and tokens come as a
BridgeSecurity (clients.openai.guard), made from the engine's settings by
`bridge_security`.
"""

import asyncio
import contextlib
import signal
import socket
from dataclasses import dataclass

from clients.client import DEFAULT_SERVER
from clients.openai.app import create_app
from clients.openai.guard import BridgeSecurity

# --------------------------------------------------------------- running ----


@dataclass
class BridgeHandle:
    """A bridge serving in the running event loop."""

    server: object  # uvicorn.Server
    task: asyncio.Task
    backend: object  # clients.openai.backend.Backend
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


async def start_bridge(
    engine, host: str, port: int, security: BridgeSecurity | None = None
) -> BridgeHandle:
    """Serve the bridge on host:port (0: any free port) inside the running loop, in front of
    `engine` (a gRPC address, or a backend: clients.openai.app.create_app).

    The socket is bound here, so a taken port raises OSError to the caller.
    Signals stay with the caller's loop (`lineage serve` owns SIGINT/SIGTERM).
    `security` adds tokens (401 without one) and TLS (mTLS with a client CA).
    """
    import uvicorn

    security = security or BridgeSecurity()
    app = create_app(engine, security)
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
            task.result()
            raise RuntimeError("the HTTP bridge stopped while starting")
        await asyncio.sleep(0.01)
    port = sock.getsockname()[1]
    return BridgeHandle(server, task, app.state.backend, host, port, bool(security.tls_cert))


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


async def _serve_until_signal(
    grpc_address: str, host: str, port: int, security: BridgeSecurity | None = None
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    handle = await start_bridge(grpc_address, host, port, security)
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
) -> int:
    """The blocking job of `lineage bridge`: serve until SIGINT/SIGTERM. Returns the exit code."""
    return asyncio.run(_serve_until_signal(grpc_address, host, port, security))
