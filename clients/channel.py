"""How a client reaches the engine: plain or TLS channel, and the bearer token it sends.

`Security.from_env(...)` takes explicit values first, then the environment
(LINEAGE_AUTH_TOKEN, LINEAGE_TLS_CA, LINEAGE_TLS_CLIENT_CERT,
LINEAGE_TLS_CLIENT_KEY); a client that calls for others (the bridge) takes no
token from the environment (`env_token=False`): each of its calls carries its
caller's, or none. `channel(...)` opens a sync or asyncio gRPC channel with
it. It knows grpc alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import grpc


@dataclass(frozen=True)
class Security:
    auth_token: str | None = None
    tls: bool = False  # TLS with the system's roots unless `tls_ca` is given
    tls_ca: str | None = None  # PEM file of the CA (or self-signed cert) to trust
    tls_cert: str | None = None  # client certificate and key, for mTLS
    tls_key: str | None = None

    @staticmethod
    def from_env(
        auth_token: str | None = None,
        tls: bool | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        env: Mapping[str, str] | None = None,
        env_token: bool = True,
    ) -> "Security":
        env = os.environ if env is None else env
        ca = tls_ca or env.get("LINEAGE_TLS_CA") or None
        cert = tls_cert or env.get("LINEAGE_TLS_CLIENT_CERT") or None
        key = tls_key or env.get("LINEAGE_TLS_CLIENT_KEY") or None
        if bool(cert) != bool(key):
            raise ValueError("a client certificate needs its key (LINEAGE_TLS_CLIENT_KEY)")
        on = bool(tls) or bool(ca) or bool(cert)
        token = auth_token or (env.get("LINEAGE_AUTH_TOKEN") if env_token else None) or None
        return Security(token, on, ca, cert, key)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.auth_token}"),) if self.auth_token else ()

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path):
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.tls_ca),
            private_key=read(self.tls_key),
            certificate_chain=read(self.tls_cert),
        )


def channel(server: str, security: Security, options: Sequence[tuple[str, Any]], aio: bool):
    """A gRPC channel to `server` ("host:port", or "unix:/path")."""
    grpc_ = grpc.aio if aio else grpc
    if security.tls and not server.startswith("unix:"):
        return grpc_.secure_channel(server, security.credentials(), options=list(options))
    return grpc_.insecure_channel(server, options=list(options))
