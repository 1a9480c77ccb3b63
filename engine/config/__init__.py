"""The one configuration tree of the engine.

Frozen dataclasses, built once in ``main()`` from CLI flags and the environment
(``EngineConfig.from_sources``) and passed down. Nothing below ``main()`` reads
the environment or an argparse namespace. Two branches live in modules of
their own and are re-exported here: the input limits (`limits`) and the
memory plan made once the model is loaded (`memory`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping

# Re-exported (`X as X`): the limits' and the memory plan's names, as engine.config's.
from engine.config.limits import CACHE_BLOCK as CACHE_BLOCK
from engine.config.limits import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from engine.config.limits import MAX_REQUEST_BYTES as MAX_REQUEST_BYTES
from engine.config.limits import Limits, flag_name
from engine.config.memory import GB, machine_memory
from engine.config.memory import POOL_MAX as POOL_MAX
from engine.config.memory import MemoryPlan as MemoryPlan
from engine.config.memory import plan_memory as plan_memory
from engine.config.memory import with_memory as with_memory

CACHE_MODES = ("lineage", "exact", "off")
# How a request's cache namespace shows in metrics and `lineage top`: a short hash
# (default: namespaces can name tenants), as it is (opt-in), or not at all.
METRICS_NAMESPACE_TAGS = ("hash", "plain", "off")
# Prefill order of the model actor (engine/runtime/scheduler.py); batched is mlx-lm's
# padded prefill batch, kept as the baseline.
SCHEDULES = ("srpt", "fifo", "batched")
PREFILL_EVALS = ("auto", "module", "forward")  # how the prefill worker evaluates a chunk
GATED_DELTA_MODES = ("auto", "fast", "ops")


def default_cache_dir() -> Path:
    """The platform's user cache directory for the engine."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("lineage-engine"))


def parse_bytes(text: str | int) -> int:
    """'48G', '512M', '1T', '1024' -> bytes. Raises ValueError naming the text."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if s and s[-1] in units:
            return int(float(s[:-1]) * units[s[-1]])
        return int(s)
    except ValueError:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 48G, 512M, 1T)")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None  # None: the embedded default model
    prefill_step_size: int = 512
    max_batch: int = 8  # concurrent sequences in the batch generator
    max_queue: int = 256  # requests in flight (batch + waiting); more get RESOURCE_EXHAUSTED
    max_context: int | None = None  # None: from the model's config
    schedule: str = "srpt"  # srpt | fifo | batched
    prefill_budget: int = 256  # most prompt tokens per step; a prefill this short runs whole
    prefill_group: int = 1  # sequences of similar length prefilled in one chunk (srpt, fifo)
    # srpt/fifo chunk sizing in time: beside decode a step aims at this many idle
    # decode steps; with nothing decoding a long prompt's chunk aims at slice_ms.
    prefill_step_factor: float = 2.5
    prefill_slice_ms: float = 50.0
    # srpt/fifo: a chunk's forward runs on a thread of its own beside the decode steps.
    prefill_overlap: bool = True
    # How the worker evaluates a long prefill's chunk: `module` by module (its MLX queue
    # stays short, so decode steps are not throttled behind it), `forward` whole; `auto`:
    # module on the CPU device (engine.runtime.prefill_worker). A short one: whole.
    prefill_eval: str = "auto"
    # Prompt plus max_tokens of every running sequence together (TGI's
    # --max-batch-total-tokens); None: sized from memory (see plan_memory).
    max_batch_tokens: int | None = None

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        for flag, value in (
            ("--prefill-budget", self.prefill_budget),
            ("--prefill-group", self.prefill_group),
            ("--prefill-step-size", self.prefill_step_size),
            ("--max-batch", self.max_batch),
        ):
            if value < 1:
                raise ValueError(f"{flag} must be a positive number, got {value}")
        if not self.prefill_step_factor > 1:
            raise ValueError(
                f"--prefill-step-factor must be above 1 (a step includes the decode), "
                f"got {self.prefill_step_factor}"
            )
        if self.prefill_eval not in PREFILL_EVALS:
            raise ValueError(
                f"--prefill-eval {self.prefill_eval!r} is not one of {', '.join(PREFILL_EVALS)}"
            )
        if not self.prefill_slice_ms > 0:
            raise ValueError(f"--prefill-slice-ms must be positive, got {self.prefill_slice_ms}")


@dataclass(frozen=True)
class CacheConfig:
    mode: str = "lineage"  # lineage | exact | off
    ram_budget: int = 48 * GB  # capped at half the machine's memory
    # True: ram_budget is a default, sized by plan_memory once the weights are known.
    ram_budget_auto: bool = False
    # Everything the engine holds: weights + running sequences' KV + RAM tier + MLX
    # pool; None: three quarters of the machine's memory.
    memory_limit: int | None = None
    anchor_max_entries: int = 16
    anchor_max_bytes: int = 16 * GB
    max_checkpoints: int = 4  # per lineage; anchors are separate entries
    guard_offset: int = 16  # guard checkpoint at prompt length minus this
    # Guard only when the uncached suffix is this long. None: derived at load from
    # the measured per-forward and per-token costs (engine.runtime.loader), what
    # `from_sources` gives unless --guard-min-suffix is set; a CacheConfig built
    # directly (tests, the pure policy) keeps the reference's fixed 256.
    guard_min_suffix: int | None = 256
    # State-only checkpoints inside a long (system + tools) block: every this many
    # tokens, at most message_max of them, so a variant of a long system prompt
    # restores at the last one before its change.
    message_interval: int = 2048
    message_max: int = 4
    divergence_min_gain: int = 256
    anchor_slack: int = 2  # BPE merges at the anchor boundary
    exact_max_entries: int = 8  # exact mode: plain LRU by entry count and bytes
    cache_dir: str | None = None  # None: the platform's user cache directory
    disk_budget: int = 1 << 40  # capped at half of (free disk + the cache's own files)
    # Bytes of writes the disk writer may hold queued (past it a write is refused and
    # its file never indexed); None: a quarter of the RAM budget, at least 256M.
    disk_queue_bytes: int | None = None
    spill_on_evict: bool = True
    clear_pool_per_prefill: bool = False  # opt-in mx.clear_cache() per chunk
    pool_limit: int | None = None  # MLX buffer-pool cap; None: sized from the RAM budget
    layer_timer_flag: str | None = None  # a file whose presence turns on the per-layer timer
    layer_timer_requests: int = 4

    def __post_init__(self):
        if self.mode not in CACHE_MODES:
            raise ValueError(f"cache mode {self.mode!r} is not one of {', '.join(CACHE_MODES)}")
        if self.disk_queue_bytes is not None and self.disk_queue_bytes <= 0:
            raise ValueError(f"--disk-queue-limit must be positive, got {self.disk_queue_bytes}")

    @property
    def disk_queue_cap(self) -> int:
        """The disk writer's cap on queued bytes."""
        if self.disk_queue_bytes is not None:
            return self.disk_queue_bytes
        return max(self.ram_budget // 4, 256 << 20)

    @property
    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


@dataclass(frozen=True)
class Identity:
    """Who holds a token: its cache namespace, and whether it may act for any namespace."""

    token: str
    namespace: str = ""
    admin: bool = False

    def __repr__(self) -> str:  # the token never reaches a log line
        return f"Identity(namespace={self.namespace!r}, admin={self.admin})"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    address: str | None = None  # Ray cluster address; None starts Ray locally
    num_cpus: int | None = None
    http_port: int | None = None  # OpenAI bridge, off by default
    ray_namespace: str = "lineage"  # the Ray namespace the actors are named in
    metrics_port: int | None = None  # Prometheus text at http://127.0.0.1:P/metrics; None: off
    replicas: int | str = 1  # model replicas; "auto": one per `mlx` resource of the cluster
    route_threshold: int = 4096  # queued prefill tokens a holder may exceed the least loaded by
    metrics_namespace: str = "hash"  # the namespace tag on metrics and `lineage top`
    tokens: tuple[Identity, ...] = ()  # empty: no authentication
    tls_cert: str | None = None  # PEM files; both set: gRPC and the bridge serve TLS
    tls_key: str | None = None
    tls_client_ca: str | None = None  # set: clients must present a certificate it signed
    insecure: bool = False  # allow a non-loopback bind without a token
    reflection: bool | None = None  # None: on only when bound to loopback
    # False: cached-token figures sent to clients are rounded down to CACHE_BLOCK.
    # `lineage serve` (from_sources) rounds unless asked; an engine built in code
    # (benchmarks, tests) reports exact figures unless it asks to round.
    exact_cache_figures: bool = True
    max_restarts: int = -1  # per actor, Ray's max_restarts (-1: without limit)
    call_deadline: float = 30.0  # seconds: any actor call, and the wait for a restart
    stream_deadline: float = 300.0  # seconds: the longest silence of a model stream
    loop_deadline: float = 10.0  # seconds: the model loop answers a health ping within it
    max_concurrent_rpcs: int | None = None  # gRPC's limit; None: max_queue + 64

    def __post_init__(self):
        if self.metrics_namespace not in METRICS_NAMESPACE_TAGS:
            raise ValueError(
                f"metrics namespace tag {self.metrics_namespace!r} is not one of "
                f"{', '.join(METRICS_NAMESPACE_TAGS)}"
            )
        if not self.ray_namespace:
            raise ValueError("the Ray namespace must not be empty")
        if self.replicas != "auto" and not (isinstance(self.replicas, int) and self.replicas >= 1):
            raise ValueError(f"replicas must be a number >= 1 or 'auto', got {self.replicas!r}")
        if self.route_threshold < 0:
            raise ValueError(f"route threshold must be >= 0, got {self.route_threshold}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")

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


@dataclass(frozen=True)
class KernelConfig:
    """Kernels installed into the model at load (engine/kernels/)."""

    sparse: bool = True  # DSA short-chunk paths; False: mlx-lm's stock attention
    sparse_decode_max: int = 128  # chunks of 2..this many tokens: the decode shape
    sparse_gather_max: int = 512  # up to this many: block-gather; longer: stock
    sparse_block: int = 64  # block-gather granularity, in tokens
    gated_delta: str = "auto"  # auto | fast | ops (mx.fast.gated_delta_update off Metal)
    dense: bool = True  # dense attention on the CPU through the host BLAS; False: MLX's
    dense_min_keys: int = 1024  # ... from this many keys (shorter: MLX's)

    def __post_init__(self):
        if not 1 <= self.sparse_decode_max <= self.sparse_gather_max:
            raise ValueError(
                f"sparse thresholds: need 1 <= decode max ({self.sparse_decode_max}) "
                f"<= gather max ({self.sparse_gather_max})"
            )
        if self.sparse_block < 1:
            raise ValueError(f"sparse block {self.sparse_block} must be positive")
        if self.gated_delta not in GATED_DELTA_MODES:
            raise ValueError(
                f"gated delta {self.gated_delta!r} is not one of {', '.join(GATED_DELTA_MODES)}"
            )
        if self.dense_min_keys < 1:
            raise ValueError(f"dense min keys {self.dense_min_keys} must be positive")


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


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)
    limits: Limits = field(default_factory=Limits)

    @staticmethod
    def from_sources(
        flags: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> "EngineConfig":
        """Build the tree: CLI flags win over the environment, which wins over defaults.

        ``flags`` holds only the flags the user gave (None values are ignored).
        Raises ValueError naming a value that does not parse.
        """
        pick = _Picker(flags or {}, dict(os.environ if env is None else env))
        return EngineConfig(
            model=_model(pick),
            cache=_cache(pick),
            server=_server(pick),
            kernels=_kernels(pick),
            limits=_limits(pick),
        )

    def with_cache(self, **changes) -> "EngineConfig":
        return replace(self, cache=replace(self.cache, **changes))

    def with_model(self, **changes) -> "EngineConfig":
        return replace(self, model=replace(self.model, **changes))

    def with_server(self, **changes) -> "EngineConfig":
        return replace(self, server=replace(self.server, **changes))

    def with_kernels(self, **changes) -> "EngineConfig":
        return replace(self, kernels=replace(self.kernels, **changes))


class _Picker:
    """A setting's value: its flag if given, else its environment variable, else a default."""

    def __init__(self, flags: Mapping[str, object], env: Mapping[str, str]):
        self.flags = {k: v for k, v in flags.items() if v is not None}
        self.env = env

    def __call__(self, flag: str, var: str | None, default):
        if flag in self.flags:
            return self.flags[flag]
        if var and self.env.get(var):
            return self.env[var]
        return default

    def optional(self, flag: str, var: str, parse):
        value = self(flag, var, None)
        return parse(value) if value is not None else None


def _cache(pick: _Picker) -> CacheConfig:
    mode = pick("cache_mode", "LINEAGE_CACHE_MODE", None)
    if mode is None:
        mode = "exact" if pick.env.get("APC_LINEAGE") == "0" else "lineage"
    given = pick("ram_budget", "LINEAGE_RAM_BUDGET", None)
    ram = min(parse_bytes(given if given is not None else 48 * GB), machine_memory() // 2)
    cache_dir = pick("cache_dir", "LINEAGE_CACHE_DIR", None)
    disk = parse_bytes(pick("disk_budget", "LINEAGE_DISK_BUDGET", 1 << 40))
    probe = Path(cache_dir) if cache_dir else default_cache_dir()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    # The cache's own files count as available: measured at a restart, the free
    # space alone would trim a cache that already filled its half at its first commit.
    own = _entry_bytes(Path(cache_dir) if cache_dir else default_cache_dir())
    disk = min(disk, (shutil.disk_usage(probe).free + own) // 2)
    return CacheConfig(
        mode=str(mode),
        ram_budget=ram,
        ram_budget_auto=given is None,
        memory_limit=pick.optional("memory_limit", "LINEAGE_MEMORY_LIMIT", parse_bytes),
        anchor_max_bytes=min(CacheConfig.anchor_max_bytes, ram),
        cache_dir=str(cache_dir) if cache_dir else None,
        disk_budget=disk,
        disk_queue_bytes=pick.optional("disk_queue_limit", "LINEAGE_DISK_QUEUE_LIMIT", parse_bytes),
        clear_pool_per_prefill=str(pick("clear_pool", "LINEAGE_CLEAR_POOL", "0")).lower()
        in ("1", "true", "yes"),
        layer_timer_flag=pick("layer_timer_flag", "LINEAGE_LAYER_TIMER_FLAG", None),
        pool_limit=pick.optional("pool_limit", "LINEAGE_POOL_LIMIT", parse_bytes),
        guard_min_suffix=pick.optional("guard_min_suffix", "LINEAGE_GUARD_MIN_SUFFIX", int),
    )


def _entry_bytes(cache_dir: Path) -> int:
    """Bytes of the entry files (`entries*/*.entry`) already in the cache directory."""
    total = 0
    for directory in cache_dir.glob("entries*") if cache_dir.is_dir() else ():
        for f in directory.glob("*.entry"):
            try:
                total += f.stat().st_size
            except OSError:  # removed meanwhile
                continue
    return total


def _model(pick: _Picker) -> ModelConfig:
    return ModelConfig(
        path=pick("model", "LINEAGE_MODEL", None),
        prefill_step_size=_int(pick, "prefill_step_size", "LINEAGE_PREFILL_STEP", 512),
        max_batch=_int(pick, "max_batch", "LINEAGE_MAX_BATCH", 8),
        schedule=str(pick("schedule", "LINEAGE_SCHEDULE", ModelConfig.schedule)),
        prefill_budget=_int(pick, "prefill_budget", "LINEAGE_PREFILL_BUDGET", 256),
        prefill_group=_int(pick, "prefill_group", "LINEAGE_PREFILL_GROUP", 1),
        prefill_step_factor=_float(
            pick,
            "prefill_step_factor",
            "LINEAGE_PREFILL_STEP_FACTOR",
            ModelConfig.prefill_step_factor,
        ),
        prefill_slice_ms=_float(
            pick, "prefill_slice_ms", "LINEAGE_PREFILL_SLICE_MS", ModelConfig.prefill_slice_ms
        ),
        prefill_overlap=_switch(
            pick("prefill_overlap", "LINEAGE_PREFILL_OVERLAP", ModelConfig.prefill_overlap),
            "--prefill-overlap (LINEAGE_PREFILL_OVERLAP)",
        ),
        prefill_eval=str(pick("prefill_eval", "LINEAGE_PREFILL_EVAL", ModelConfig.prefill_eval)),
        max_queue=_int(pick, "max_queue", "LINEAGE_MAX_QUEUE", 256),
        max_batch_tokens=pick.optional("max_batch_tokens", "LINEAGE_MAX_BATCH_TOKENS", int),
    )


def _int(pick: _Picker, flag: str, var: str, default: int, parse=int) -> int:
    """An integer setting; ValueError naming the flag and its variable when it does not parse."""
    value = pick(flag, var, default)
    try:
        return parse(value)
    except (TypeError, ValueError):
        kind = "a number" if parse is float else "an integer"
        raise ValueError(f"{flag_name(flag)} ({var}) must be {kind}, got {value!r}")


def _float(pick: _Picker, flag: str, var: str, default: float) -> float:
    """A number setting (`_int` parsing a float)."""
    return _int(pick, flag, var, default, parse=float)


def _limits(pick: _Picker) -> Limits:
    """Every limit from its flag or LINEAGE_<NAME>; sizes (`..._bytes`) take 4M, 256K."""
    values = {}
    for f in fields(Limits):
        parse = parse_bytes if f.name.endswith("_bytes") else int
        values[f.name] = _int(pick, f.name, "LINEAGE_" + f.name.upper(), f.default, parse)
    return Limits(**values)


def _flag(value) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _server(pick: _Picker) -> ServerConfig:
    tokens: tuple[Identity, ...] = ()
    token_file = pick("auth_token_file", "LINEAGE_AUTH_TOKEN_FILE", None)
    if token_file:
        tokens = read_token_file(str(token_file))
    token = pick("auth_token", "LINEAGE_AUTH_TOKEN", None)
    if token:
        tokens = (Identity(str(token), "", admin=True),) + tokens
    return ServerConfig(
        host=str(pick("host", "LINEAGE_HOST", "127.0.0.1")),
        port=int(pick("port", "LINEAGE_PORT", 50051)),
        address=pick("address", "LINEAGE_RAY_ADDRESS", None),
        http_port=pick.optional("http_port", "LINEAGE_HTTP_PORT", int),
        tokens=tokens,
        tls_cert=pick("tls_cert", "LINEAGE_TLS_CERT", None),
        tls_key=pick("tls_key", "LINEAGE_TLS_KEY", None),
        tls_client_ca=pick("tls_client_ca", "LINEAGE_TLS_CLIENT_CA", None),
        insecure=_flag(pick("insecure", "LINEAGE_INSECURE", False)),
        reflection=pick.optional("reflection", "LINEAGE_REFLECTION", _flag),
        exact_cache_figures=_flag(
            pick("exact_cache_figures", "LINEAGE_EXACT_CACHE_FIGURES", False)
        ),
        ray_namespace=str(pick("ray_namespace", "LINEAGE_RAY_NAMESPACE", "lineage")),
        metrics_port=pick.optional("metrics_port", "LINEAGE_METRICS_PORT", int),
        replicas=_replicas(pick("replicas", "LINEAGE_REPLICAS", 1)),
        route_threshold=int(pick("route_threshold", "LINEAGE_ROUTE_THRESHOLD", 4096)),
        metrics_namespace=str(pick("metrics_namespace", "LINEAGE_METRICS_NAMESPACE", "hash")),
        max_restarts=int(pick("max_restarts", "LINEAGE_MAX_RESTARTS", -1)),
        call_deadline=float(pick("call_deadline", "LINEAGE_CALL_DEADLINE", 30.0)),
        stream_deadline=float(pick("stream_deadline", "LINEAGE_STREAM_DEADLINE", 300.0)),
        loop_deadline=float(pick("loop_deadline", "LINEAGE_LOOP_DEADLINE", 10.0)),
        max_concurrent_rpcs=pick.optional(
            "max_concurrent_rpcs", "LINEAGE_MAX_CONCURRENT_RPCS", int
        ),
    )


def _switch(text: str | bool, name: str) -> bool:
    """'1'/'on'/'true'/'yes' or '0'/'off'/'false'/'no' -> bool. Raises ValueError naming it."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{name}: {text!r} is not on/off (1/0)")


def _kernels(pick: _Picker) -> KernelConfig:
    return KernelConfig(
        sparse=_switch(pick("sparse_kernels", "LINEAGE_SPARSE_KERNELS", True), "sparse kernels"),
        sparse_decode_max=int(pick("sparse_decode_max", "LINEAGE_SPARSE_DECODE_MAX", 128)),
        sparse_gather_max=int(pick("sparse_gather_max", "LINEAGE_SPARSE_GATHER_MAX", 512)),
        sparse_block=int(pick("sparse_block", "LINEAGE_SPARSE_BLOCK", 64)),
        gated_delta=str(pick("gated_delta", "LINEAGE_GATED_DELTA", "auto")),
        dense=_switch(pick("dense_kernel", "LINEAGE_DENSE_KERNEL", True), "dense kernel"),
        dense_min_keys=int(
            pick("dense_min_keys", "LINEAGE_DENSE_MIN_KEYS", KernelConfig.dense_min_keys)
        ),
    )


def _replicas(value) -> int | str:
    """'auto' or a replica count; ValueError naming anything else."""
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"replicas must be a number or 'auto', got {value!r}") from None
