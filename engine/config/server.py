"""The server branch of the configuration: where it listens, who may call, how it is run.

Each operator setting is declared once here, beside its field (engine.config.declare).
It checks its own values and whether a bind is exposed without a token; it reads a
token file when asked. engine/server applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config.declare import Setting, label_of, parse_str, setting, sourced
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

    def namespace_for(self, requested: str) -> str:
        """The cache namespace a request of this caller runs in, whatever it names.

        An admin's is the one it names. A tenant's is its own, and a name it gives
        becomes a sub-namespace (`tenant/name`); a name already inside its own
        stays as it is, so the engine and a bridge in front of it may both apply
        this and agree. Namespaces of tenants never nest (`nested`), so no name
        reaches another tenant's.
        """
        if self.admin:
            return requested
        own = self.namespace
        if not requested or requested == own or requested.startswith(own + "/"):
            return requested or own
        return f"{own}/{requested}"


def nested(identities) -> tuple[str, str] | None:
    """Two tenant namespaces one of which lies inside the other (`acme`, `acme/dev`), if any.

    With both, `acme` naming `dev` would run in `acme/dev`'s namespace.
    """
    tenants = sorted({i.namespace for i in identities if not i.admin})
    for outer in tenants:
        for inner in tenants:
            if inner.startswith(outer + "/"):
                return outer, inner
    return None


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
        None,
        "serve Prometheus metrics at http://127.0.0.1:P/metrics; without it a local Ray "
        "records none (Ray's own recording grows the raylet's memory: ray-project/ray#50955)",
        metavar="P",
        shown="off",
    )
    ray_dashboard: bool = setting(
        False,
        "start Ray's dashboard with a local Ray (its head and ~10 module processes, ~1 GiB); "
        "metrics, `lineage top` and `lineage stats` do not need it",
    )
    log_file: str | None = setting(
        None,
        "write the log to this file, rotated at --log-file-bytes (two older files kept)",
        metavar="PATH",
        shown="stderr",
    )
    log_file_bytes: int = setting(
        64 << 20, "the log file's size before it rotates (--log-file)", parse=parse_bytes
    )
    heap_trace: int = setting(
        0,
        "frames of each allocation the front end traces (tracemalloc, from its start; "
        "0: none); SIGUSR2 then writes a heap snapshot into LINEAGE_HEAP_TRACE_DIR",
        flag=None,
    )
    heap_trace_dir: str | None = setting(
        None,
        "where SIGUSR2 writes the front end's heap snapshots (LINEAGE_HEAP_TRACE)",
        flag=None,
        shown="the working directory",
    )
    malloc_arenas: int = setting(
        2,
        "glibc malloc arenas the front end may use (0: glibc's eight per core); fewer "
        "arenas hold less freed memory between requests",
        flag=None,
    )
    malloc_trim_s: float = setting(
        30.0,
        "seconds between returns of the front end's and the cache manager's free malloc "
        "pages to the system (malloc_trim; 0: never)",
        flag=None,
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
    flight_wait: float = setting(
        60.0,
        "seconds a prompt may wait for a request in flight whose capture would restore much "
        "of it (a long turn sent while the turn it extends still prefills); 0: never wait",
        metavar="S",
    )
    stream_deadline: float = setting(
        300.0, "seconds: the longest silence of a model stream", metavar="S"
    )
    loop_deadline: float = setting(
        10.0, "seconds: the model loop answers a health ping within it", metavar="S"
    )
    max_concurrent_rpcs: int | None = setting(
        None,
        "Engine calls at once (more: RESOURCE_EXHAUSTED); health checks never count",
        shown="max-queue + 64",
    )
    health_watchers: int = setting(16, "grpc.health.v1 Watch streams at once")
    health_watch_seconds: float = setting(
        300.0, "seconds: a Watch stream ends after it (the client watches again)", metavar="S"
    )
    allow_open_engine: bool = setting(
        False,
        "let a bridge with tenant tokens front an engine that checks no token (whoever "
        "reaches the engine then names any namespace)",
        switch=True,
        shown="off",
    )
    http_header_deadline: float = setting(
        10.0, "seconds: a bridge request's headers arrive within it, else it is cut", metavar="S"
    )
    http_body_deadline: float = setting(
        60.0, "seconds: a bridge request's body arrives within it, else 408", metavar="S"
    )
    # Longer than any common client keeps an idle connection for reuse (httpx and the OpenAI
    # and Anthropic SDKs on it 5 s, aiohttp 15 s, nginx's upstream default 60 s): a server
    # that closes first races the client's next request on that connection, which then fails
    # without a reply and a POST may not be resent (RFC 9110 9.2.2).
    http_keep_alive: float = setting(
        75.0, "seconds: an idle kept bridge connection stays open that long", metavar="S"
    )
    http_max_connections: int = setting(
        1024, "connections the bridge holds at once (one more is closed at once)"
    )
    metrics_namespaces: int = setting(
        32, "tenants (root namespaces) the metrics tag apart; the rest share `other`"
    )
    ray_public: bool = setting(
        False,
        "let the Ray `lineage serve` starts listen beyond 127.0.0.1 (its GCS, workers, "
        "metrics exporter and dashboard agent)",
        switch=True,
        shown="off",
    )
    # The names the HTTP bridge answers to (clients.bridge.models); () means "lineage" and
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
        pair = nested(self.tokens)
        if pair is not None:
            raise ValueError(
                f"tenant namespaces must not nest: {pair[1]!r} lies inside {pair[0]!r}, whose "
                f"tenant would reach it by naming {pair[1][len(pair[0]) + 1 :]!r}"
            )
        for name in ("health_watchers", "http_max_connections", "metrics_namespaces"):
            if getattr(self, name) < 1:
                raise ValueError(f"{label_of(ServerConfig, name)} must be at least 1")
        for name in (
            "health_watch_seconds",
            "http_header_deadline",
            "http_body_deadline",
            "http_keep_alive",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{label_of(ServerConfig, name)} must be positive")

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
    pair = nested(out)
    if pair is not None:
        raise ValueError(
            f"{path}: tenant namespaces must not nest: {pair[1]!r} lies inside {pair[0]!r}"
        )
    return tuple(out)
