"""What `lineage serve` checks before Ray starts or a model loads: its ports, its model.

A port another process holds (`--port`, `--http-port`, `--metrics-port`), or
the same port given to two of them, and a `--model` or `--draft-model` that
is no model directory are found here, in a second, each as one ValueError
naming the flag: not after Ray has started and the weights have loaded, when
a bind or a load fails inside an actor. A model given by its Hugging Face name
is resolved here too (`fetch_models`: the cache, else a download; engine.hub),
so that what Ray starts with is local directories only.

It knows the sockets the server will bind and the files mlx-lm loads; it
imports neither Ray nor MLX. A port can still be taken between this check and
the bind: the server then fails to bind, and stops what it started.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import replace

from engine.config import EngineConfig, ModelConfig, ServerConfig
from engine.config.declare import label_of
from engine.config.fleet import FleetConfig
from engine.config.model import check_model_dir
from engine.hub import HubSettings, parse_ref, resolve


def fetch_models(config: EngineConfig, settings: HubSettings, **options) -> EngineConfig:
    """`config` with each model and draft model given as `org/name[@rev]` replaced by its
    snapshot directory in the Hugging Face cache (downloaded if need be; `options` go to
    engine.hub `resolve`). HubError, one line naming the flag, for what cannot be had."""
    model = label_of(FleetConfig, "models")
    done: dict[str, str] = {}

    def local(text: str | None, label: str) -> str | None:
        if not text or parse_ref(text) is None:
            return text
        if text not in done:
            done[text] = str(resolve(text, settings, label=label, **options))
        return done[text]

    specs = tuple(
        replace(
            spec,
            path=local(spec.path, f"{model} {spec.name}=" if spec.name else model),
            draft_model=local(spec.draft_model, f"{model} {spec.name}=...,draft_model"),
        )
        for spec in config.fleet.models
    )
    return replace(
        config,
        model=replace(
            config.model,
            path=local(config.model.path, model),
            draft_model=local(config.model.draft_model, label_of(ModelConfig, "draft_model")),
        ),
        fleet=replace(config.fleet, models=specs),
    )


def check(config: EngineConfig) -> None:
    """ValueError naming the flag of the first port taken or model directory missing (each
    declared model's, and its draft model's)."""
    check_ports(config.server)
    model = label_of(FleetConfig, "models")
    if config.model.path:
        check_model_dir(config.model.path, model)
    for spec in config.fleet.models:
        if spec.path:
            check_model_dir(spec.path, f"{model} {spec.name}=" if spec.name else model)
        if spec.draft_model:
            check_model_dir(spec.draft_model, f"{model} {spec.name}=...,draft_model")
    if config.model.draft_model:
        check_model_dir(config.model.draft_model, label_of(ModelConfig, "draft_model"))


def ports(server: ServerConfig) -> list[tuple[str, str, int]]:
    """(flag, host, port) of each TCP port `lineage serve` will bind: gRPC (unless 0, any
    free one), the bridge's, and the metrics exporter of a Ray of its own (a cluster's
    nodes export their own)."""
    out = []
    if server.port:
        out.append((label_of(ServerConfig, "port"), server.host, server.port))
    if server.http_port:
        out.append((label_of(ServerConfig, "http_port"), server.host, server.http_port))
    if server.metrics_port and not server.address:
        # Ray's exporter listens on loopback unless --ray-public (loopback_ray)
        host = "0.0.0.0" if server.ray_public else "127.0.0.1"
        out.append((label_of(ServerConfig, "metrics_port"), host, server.metrics_port))
    return out


def check_ports(server: ServerConfig) -> None:
    """ValueError naming the flag of a port given twice or held by another process."""
    seen: dict[int, str] = {}
    for flag, host, port in ports(server):
        if port in seen:
            raise ValueError(f"{flag}: port {port} is also given to {seen[port]}")
        seen[port] = flag
        problem = bind_problem(host, port)
        if problem:
            raise ValueError(f"{flag}: cannot listen on {host}:{port}: {problem}")


def bind_problem(host: str, port: int) -> str | None:
    """Why a listening socket cannot take `host:port` now, or None when it can.

    SO_REUSEADDR as the servers set it, so a port whose last connections are in
    TIME_WAIT is free, and one another socket listens on is not.
    """
    try:
        infos = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as error:
        return f"unknown host ({error.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
            s.listen(1)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return "another process listens there (stop it, or give another port)"
            return error.strerror or str(error)
    return None
