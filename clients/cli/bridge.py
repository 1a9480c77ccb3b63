"""`lineage bridge`: the OpenAI-compatible HTTP bridge in front of a running engine.

Parses the bridge's address, its security settings (tokens, TLS, body cap,
deadlines), its model names and its response store (the same settings `lineage
serve` declares, engine.config.server, .cache and .limits), refuses an exposed
bind without a token (and tenant tokens in front of an engine that checks
none), and serves clients.bridge until SIGINT/SIGTERM. FastAPI and uvicorn
load only when it runs.
"""

from __future__ import annotations

import argparse

from clients.cli.args import UsageError, add_settings, config_from_args
from clients.client import DEFAULT_SERVER
from engine.config import ServerConfig
from engine.config.catalog import SETTINGS

HELP = "serve an OpenAI-compatible HTTP API in front of a running engine"
# The serve settings the bridge applies itself.
BRIDGE_SETTINGS = (
    "auth_token",
    "auth_token_file",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "insecure",
    "max_body_bytes",
    "served_model_name",
    "model_alias",
    "responses_max",
    "responses_max_bytes",
    "cache_dir",
    "max_request_bytes",
    "allow_open_engine",
    "http_header_deadline",
    "http_body_deadline",
    "http_keep_alive",
    "http_max_connections",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The CLI fills --server from $LINEAGE_SERVER."""
    p.add_argument(
        "--server",
        metavar="HOST:PORT",
        help=f"engine address (default: $LINEAGE_SERVER or {DEFAULT_SERVER})",
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000)")
    add_settings(p, [s for s in SETTINGS if s.name in BRIDGE_SETTINGS])


def run(args: argparse.Namespace) -> int:
    from clients.bridge.server import bridge_options, bridge_security, run_bridge

    try:
        config = config_from_args(args, args.env, BRIDGE_SETTINGS)
        server = config.server
        ServerConfig(
            host=args.host, tokens=server.tokens, insecure=server.insecure
        ).check_exposure()
    except (ValueError, OSError) as error:
        raise UsageError(str(error))
    security = bridge_security(server, config.limits)
    options = bridge_options(config)
    try:
        return run_bridge(args.server or DEFAULT_SERVER, args.host, args.port, security, options)
    except ValueError as error:  # tenants in front of an engine that checks no token
        raise UsageError(str(error))
