"""The server branch of the configuration: where it listens, who may call, how it is run.

Each operator setting is declared once here, beside its field (engine.config.setting).
It checks its own values and whether a bind is exposed without a token; it reads a
token file when asked. engine/server applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config.setting import Setting, label_of, parse_str, setting, sourced
from engine.config.units import GB, parse_bytes

# How a request's cache namespace shows in metrics and `lineage top`: a short hash
# (default: namespaces can name tenants), as it is (opt-in), or not at all.
METRICS_NAMESPACE_TAGS = ("hash", "plain", "off")


@dataclass(frozen=True)
class Identity:
    """Who holds a token: its cache namespace, and whether it may act for any namespace."""

    token: str
    namespace: str = ""
    admin: bool = False

    def __repr__(self) -> str:  # the token never reaches a log line
        return f"Identity(namespace={self.namespace!r}, admin={self.admin})"


def parse_replicas(value) -> int | str:
    """'auto' or a replica count."""
    if str(value).strip().lower() == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a number or 'auto'") from None


@dataclass(frozen=True)
class ServerConfig:
    """gRPC server, Ray and replicas, tokens and TLS, deadlines."""

    host: str = setting("127.0.0.1", "gRPC bind host")
    port: int = setting(50051, "gRPC port")
    address: str | None = setting(
        None,
        "join a Ray cluster (e.g. auto)",
        var="LINEAGE_RAY_ADDRESS",
        metavar="RAY_ADDR",
        shown="a Ray of its own",
    )
    num_cpus: int | None = None
    http_port: int | None = setting(None, "serve the OpenAI bridge on this port", shown="off")
    ray_namespace: str = setting("lineage", "the Ray namespace the actors are named in")
    metrics_port: int | None = setting(
        None, "serve Prometheus metrics at http://127.0.0.1:P/metrics", metavar="P", shown="off"
    )
    ray_dashboard: bool = setting(
        False,
        "start Ray's dashboard with a local Ray (its head and ~10 module processes, ~1 GiB); "
        "metrics, `lineage top` and `lineage stats` do not need it",
    )
    replicas: int | str = setting(
        1,
        "model replicas; auto: one per `mlx` resource of the Ray cluster",
        parse=parse_replicas,
        metavar="N|auto",
    )
    route_threshold: int = setting(
        4096,
        "queued prefill tokens by which the replica holding a restore point may exceed the "
        "least loaded one before a request goes to the latter",
        metavar="TOKENS",
    )
    metrics_namespace: str = setting(
        "hash",
        "the cache namespace in metrics and `lineage top`: a short hash, plain, or off",
        choices=METRICS_NAMESPACE_TAGS,
    )
    # Empty: no authentication. The operator's token (an admin) comes first.
    tokens: tuple[Identity, ...] = sourced(
        (),
        Setting(
            "the operator's token",
            name="auth_token",
            parse=parse_str,
            metavar="TOKEN",
            shown="no token",
        ),
        Setting(
            "tokens, one `TOKEN [NAMESPACE] [admin]` a line",
            name="auth_token_file",
            parse=parse_str,
            metavar="FILE",
            shown="no tokens",
        ),
    )
    # Both set: gRPC and the bridge serve TLS.
    tls_cert: str | None = setting(
        None, "serve TLS with this certificate", metavar="PEM", shown="no TLS"
    )
    tls_key: str | None = setting(None, "its private key", metavar="PEM", shown="no TLS")
    tls_client_ca: str | None = setting(
        None,
        "require client certificates signed by this CA (mTLS)",
        metavar="PEM",
        shown="no client certificates",
    )
    insecure: bool = setting(
        False, "allow a non-loopback bind without a token", switch=True, shown="off"
    )
    reflection: bool | None = setting(
        None, "serve gRPC reflection on any host", switch=True, shown="on loopback only"
    )
    # False: cached-token figures sent to clients are rounded down to CACHE_BLOCK.
    # `lineage serve` (from_sources) rounds unless asked; an engine built in code
    # (benchmarks, tests) reports exact figures unless it asks to round.
    exact_cache_figures: bool = setting(
        True,
        "send clients exact cached-token figures, not rounded down to 64",
        switch=True,
        default=False,
    )
    max_restarts: int = setting(-1, "restarts per actor (-1: without limit)")
    call_deadline: float = setting(
        30.0, "seconds: any actor call, and the wait for a restart", metavar="S"
    )
    stream_deadline: float = setting(
        300.0, "seconds: the longest silence of a model stream", metavar="S"
    )
    loop_deadline: float = setting(
        10.0, "seconds: the model loop answers a health ping within it", metavar="S"
    )
    max_concurrent_rpcs: int | None = setting(
        None, "gRPC's limit on concurrent calls", shown="max-queue + 64"
    )
    # The names the HTTP bridge answers to (clients.openai.models); () means "lineage" and
    # the model directory's name.
    served_model_name: tuple[str, ...] = setting(
        (),
        "a model name the HTTP bridge serves and /v1/models lists",
        parse=parse_str,
        repeat=True,
        metavar="NAME",
        shown="lineage and the model directory's name",
    )
    model_alias: tuple[str, ...] = setting(
        (),
        "a model-name pattern (fnmatch: claude-*, gpt-*) the HTTP bridge also serves",
        parse=parse_str,
        repeat=True,
        metavar="PATTERN",
        shown="none",
    )
    # The HTTP bridge's stored Responses (`store`), under <cache dir>/responses.
    responses_max: int = setting(10_000, "stored Responses kept; the oldest go first")
    responses_max_bytes: int = setting(
        1 * GB, "bytes of stored Responses kept; the oldest go first", parse=parse_bytes
    )

    def __post_init__(self):
        if self.metrics_namespace not in METRICS_NAMESPACE_TAGS:
            raise ValueError(
                f"{label_of(ServerConfig, 'metrics_namespace')}: metrics namespace tag "
                f"{self.metrics_namespace!r} is not one of {', '.join(METRICS_NAMESPACE_TAGS)}"
            )
        if not self.ray_namespace:
            raise ValueError(
                f"{label_of(ServerConfig, 'ray_namespace')}: the Ray namespace must not be empty"
            )
        if self.replicas != "auto" and not (isinstance(self.replicas, int) and self.replicas >= 1):
            raise ValueError(
                f"{label_of(ServerConfig, 'replicas')}: replicas must be a number >= 1 or "
                f"'auto', got {self.replicas!r}"
            )
        if self.route_threshold < 0:
            raise ValueError(
                f"{label_of(ServerConfig, 'route_threshold')}: route threshold must be >= 0, "
                f"got {self.route_threshold}"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            cert, key = label_of(ServerConfig, "tls_cert"), label_of(ServerConfig, "tls_key")
            raise ValueError(f"{cert} and {key} go together")
        for name in ("responses_max", "responses_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{label_of(ServerConfig, name)}: must be >= 1")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError(
                f"{label_of(ServerConfig, 'tls_client_ca')} needs --tls-cert and --tls-key"
            )

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def reflection_on(self) -> bool:
        return self.loopback if self.reflection is None else self.reflection

    def check_exposure(self) -> None:
        """ValueError when the server would listen beyond this machine with no token."""
        if not self.loopback and not self.tokens and not self.insecure:
            raise ValueError(
                f"refusing to serve on {self.host} without authentication: give --auth-token "
                "(or LINEAGE_AUTH_TOKEN, or --auth-token-file), or --insecure to serve anyway"
            )


def is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token_file(path: str) -> tuple[Identity, ...]:
    """Tokens from a file: one `TOKEN [NAMESPACE] [admin]` a line; `#` starts a comment.

    A token without a namespace is an admin (the operator's token). ValueError
    names the file and line of a malformed entry.
    """
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 3 or (len(words) == 3 and words[2] != "admin"):
            raise ValueError(f"{path}:{n}: expected `TOKEN [NAMESPACE] [admin]`")
        namespace = words[1] if len(words) > 1 else ""
        out.append(Identity(words[0], namespace, admin=len(words) == 1 or len(words) == 3))
    if len({i.token for i in out}) != len(out):
        raise ValueError(f"{path}: a token is listed twice")
    return tuple(out)
