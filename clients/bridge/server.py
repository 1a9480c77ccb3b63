"""The OpenAI bridge as a running server: uvicorn in the caller's event loop.

`start_bridge(...)` binds and serves the app of clients.bridge.app inside the
running loop (`lineage serve --http-port`); `run_bridge(...)` is the blocking
job of `lineage bridge`, until SIGINT/SIGTERM. TLS, tokens, caps and deadlines
come as a BridgeSecurity (clients.bridge.guard), made from the engine's
settings by `bridge_security`; the served model names and the response store's
place and bounds as BridgeOptions (clients.bridge.app), by `bridge_options`. A
connection's request headers must arrive within the header deadline (else it
is closed), requests past the connection cap get 503 and connections past
twice the cap are closed at once (`guarded_protocol`), so slow clients cannot
hold the shared loop's file descriptors. With tenant tokens the bridge refuses
to start in front of an engine that checks no token, unless told it may.
"""

import asyncio
import contextlib
import signal
import socket
import time
from dataclasses import dataclass

from clients.bridge.app import BridgeOptions, create_app
from clients.bridge.guard import BridgeSecurity
from clients.bridge.models import ServedModels
from clients.client import DEFAULT_SERVER, LineageError

# --------------------------------------------------------------- running ----


@dataclass
class BridgeHandle:
    """A bridge serving in the running event loop."""

    server: object  # uvicorn.Server
    task: asyncio.Task
    backend: object  # clients.bridge.backend.Backend
    store: object  # clients.bridge.response_store.ResponseStore
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
    `engine` (a gRPC address, or a backend: clients.bridge.app.create_app).

    The socket is bound here, so a taken port raises OSError to the caller.
    Signals stay with the caller's loop (`lineage serve` owns SIGINT/SIGTERM).
    `security` adds tokens (401 without one) and TLS (mTLS with a client CA);
    `options` the served model names and the response store.
    """
    import uvicorn

    security = security or BridgeSecurity()
    app = create_app(engine, security, options)
    try:
        await _check_engine(app.state.backend, security)
    except BaseException:
        await app.state.backend.close()
        raise
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http=guarded_protocol(security.header_deadline, 2 * security.max_connections),
        limit_concurrency=security.max_connections,
        timeout_keep_alive=security.keep_alive,
        **security.uvicorn_options(),
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


async def _check_engine(backend, security: BridgeSecurity, patience: float = 30.0) -> None:
    """ValueError when tenants would stand in front of an engine that checks no token (the
    engine would take any namespace from whoever reaches it) or the engine cannot be asked."""
    if not security.tenants or security.allow_open_engine:
        return
    deadline = time.monotonic() + patience
    while True:
        try:
            checks = await backend.checks_tokens()
            break
        except LineageError as error:
            if time.monotonic() > deadline:
                raise ValueError(
                    f"the bridge has tenant tokens but cannot ask the engine at "
                    f"{backend.address} whether it checks tokens: {error}"
                ) from None
            await asyncio.sleep(0.5)
    if not checks:
        raise ValueError(
            f"the engine at {backend.address} checks no token, so a tenant of the bridge could "
            "reach any namespace through it directly: give the engine the same tokens, or "
            "--allow-open-engine (LINEAGE_ALLOW_OPEN_ENGINE) to serve anyway"
        )


def guarded_protocol(header_deadline: float, max_connections: int) -> type:
    """uvicorn's h11 protocol, plus a deadline on every request's headers and a cap on
    connections (one past it is closed at once).

    The deadline runs from a connection's start and, on a kept connection, from the
    first byte of its next request: a connection still waiting for the rest of the
    headers after `header_deadline` seconds is closed. An idle kept connection is
    uvicorn's keep-alive's to close (`timeout_keep_alive`), never the deadline's: a
    deadline shorter than the clients' idle reuse closed connections under their next
    request."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.trailing_data[0]:  # the next request's first bytes came already
                self._watch_headers()

        def connection_lost(self, exc) -> None:
            self._stop_watch()
            super().connection_lost(exc)

        def _watch_headers(self) -> None:
            """A deadline while a request's headers are awaited; none once they came."""
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                self._stop_watch()
            elif self._header_timer is None:
                self._header_timer = self.loop.call_later(header_deadline, self._headers_late)

        def _stop_watch(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def bridge_security(server, limits=None) -> BridgeSecurity:
    """The bridge's gate from the engine's ServerConfig (tokens, TLS files, deadlines, caps)
    and Limits (its body cap: never more than the engine's request cap)."""
    body = {}
    if limits is not None:
        body["max_body_bytes"] = min(limits.max_body_bytes, limits.max_request_bytes)
    return BridgeSecurity(
        server.tokens,
        server.tls_cert,
        server.tls_key,
        server.tls_client_ca,
        header_deadline=server.http_header_deadline,
        body_deadline=server.http_body_deadline,
        keep_alive=server.http_keep_alive,
        max_connections=server.http_max_connections,
        allow_open_engine=server.allow_open_engine,
        **body,
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
