"""Loading the served model: its directory, the MLX model and tokenizer, and what it is.

It knows mlx-lm's loader and the model's config; it knows nothing about
actors or the server. `ModelInfo` is what the rest of the engine learns about
the model (the front end sizes prompts by it, the cache keys files by its
fingerprint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.config.model import check_model_dir


@dataclass(frozen=True)
class ModelInfo:
    path: str
    model_type: str
    vocab_size: int
    max_context: int
    fingerprint: str
    has_state_layers: bool
    eos_token_ids: tuple[int, ...]
    kernels: tuple[str, ...] = ()  # engine/kernels/ paths installed into the model
    # Measured at load (`forward_costs`): what one forward costs beyond its tokens,
    # and what one more prompt token costs; the guard threshold follows from them.
    forward_ms: float = 0.0
    token_ms: float = 0.0
    guard_min_suffix: int = 256
    weights_bytes: int = 0  # the loaded parameters
    kv_bytes_per_token: int = 0  # KV one token of one sequence holds (state layers: none)
    draft_bytes: int = 0  # the draft model's parameters (--draft-model), loaded beside it


def resolve_model_path(config: EngineConfig) -> Path:
    """The served model's directory; the embedded default is built on first use."""
    if config.model.path:
        return check_model_dir(config.model.path, "--model")
    from engine.runtime.model.tiny_models import ensure_default_model

    return ensure_default_model(config.cache.resolved_cache_dir)


def install_kernels(model, config: EngineConfig) -> tuple[str, ...]:
    """Install the configured engine/kernels/ paths into `model`; the names of those active."""
    from engine import kernels

    k = config.kernels
    sparse = (
        kernels.SparseRouting(k.sparse_decode_max, k.sparse_gather_max, k.sparse_block)
        if k.sparse
        else None
    )
    dense = k.dense_min_keys if k.dense else None
    linear = k.host_linear_min_rows if k.host_linear else None
    recurrence = k.gated_delta_host_min_steps or None
    return kernels.install(
        model,
        sparse,
        k.gated_delta,
        dense,
        k.dense_chunk_min_keys,
        k.cpu_fusion,
        linear,
        recurrence,
    )


def load_model(config: EngineConfig):
    """(model, tokenizer, ModelInfo) for the configured model, its kernels installed."""
    import mlx_lm
    from mlx.utils import tree_flatten

    from engine.runtime import layer_caches
    from engine.runtime.model.fingerprint import model_fingerprint

    path = resolve_model_path(config)
    model, tokenizer, raw = mlx_lm.load(str(path), return_config=True)
    draft_bytes = 0
    if config.model.draft_model:  # refused here, at startup, not at the first draft
        from engine.runtime.model.draft_files import check_draft, load_draft

        check_draft(config.model.draft_model, tokenizer)  # loads it, once per process
        draft = load_draft(config.model.draft_model)[0]
        draft_bytes = sum(v.nbytes for _, v in tree_flatten(draft.parameters()))
    active = install_kernels(model, config)
    kinds = [layer_caches.layer_kind(c) for c in model.make_cache()]
    dtype = kv_dtype(model)
    max_context = config.model.max_context or int(
        raw.get("max_position_embeddings") or raw.get("max_seq_len") or 32768
    )
    forward_ms, token_ms = forward_costs(model)
    info = ModelInfo(
        path=str(path),
        model_type=str(raw.get("model_type", "")),
        vocab_size=int(raw.get("vocab_size") or len(tokenizer._tokenizer)),
        max_context=max_context,
        # mlx-lm's batch cannot merge a quantized KV cache, so KV quantization is
        # not offered (the fingerprint would key it).
        fingerprint=model_fingerprint(path, dtype),
        has_state_layers=any(k != "append" for k in kinds),
        eos_token_ids=tuple(sorted(int(t) for t in tokenizer.eos_token_ids)),
        kernels=active,
        forward_ms=forward_ms,
        token_ms=token_ms,
        guard_min_suffix=guard_threshold(forward_ms, token_ms, config.cache.guard_offset),
        weights_bytes=sum(v.nbytes for _, v in tree_flatten(model.parameters())),
        kv_bytes_per_token=measure_kv_bytes_per_token(model),
        draft_bytes=draft_bytes,
    )
    return model, tokenizer, info


def kv_dtype(model) -> str:
    """The dtype of the KV cache the model fills (one token's forward on a fresh cache).

    Not a parameter's dtype: a quantized model's first parameter is packed
    uint32 while its KV cache holds the activations' dtype. A model without
    append-only layers answers its state's dtype.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.runtime import layer_caches

    cache = model.make_cache()
    model(mx.array([[0]]), cache=cache)
    layers = list(cache)
    append, state = [], []
    while layers:
        c = layers.pop(0)
        kind = layer_caches.layer_kind(c)
        if kind == layer_caches.LIST:
            layers[:0] = list(c.caches)
        else:
            arrays = [a for _, a in tree_flatten(c.state) if isinstance(a, mx.array)]
            (append if kind == layer_caches.APPEND else state).extend(arrays)
    found = append or state
    if not found:
        raise ValueError("the model's cache holds no arrays after a forward")
    return str(found[0].dtype)


def forward_costs(model, chunk: int = 128, repeats: int = 3) -> tuple[float, float]:
    """(per-forward overhead, per-token cost) in ms: the best of `repeats` forwards of 1
    and of `chunk` tokens on a fresh cache, after a warm-up. The overhead is what one
    more chunk boundary costs (a capture point splits prefill there)."""
    import time

    import mlx.core as mx

    def best(n: int) -> float:
        out = float("inf")
        for _ in range(repeats):
            cache = model.make_cache()
            tokens = mx.zeros((1, n), dtype=mx.int32)
            t0 = time.perf_counter()
            mx.eval(model(tokens, cache=cache))
            out = min(out, time.perf_counter() - t0)
        return out

    best(chunk)  # warm-up: kernels compiled, buffers in the pool
    one, many = best(1), best(chunk)
    per_token = max((many - one) / (chunk - 1), 1e-7)
    return max(one - per_token, 0.0) * 1000, per_token * 1000


def guard_threshold(forward_ms: float, token_ms: float, offset: int, most: int = 4096) -> int:
    """The shortest uncached suffix worth a guard: re-prefilling what lies between the guard
    and the restore point a resend would otherwise take (suffix - offset tokens) costs
    more than the extra forward the guard's chunk boundary adds. At most `most`."""
    if token_ms <= 0:
        return most
    return min(most, offset + math.ceil(forward_ms / token_ms))


def measure_kv_bytes_per_token(model) -> int:
    """The KV bytes one token costs: the append-only layers' rows after a one-token forward
    on a fresh cache (state layers cost nothing per token)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.runtime import layer_caches

    cache = model.make_cache()
    mx.eval(model(mx.array([[0]]), cache=cache))
    layers, per_token = list(cache), 0
    while layers:
        c = layers.pop(0)
        kind = layer_caches.layer_kind(c)
        if kind == layer_caches.LIST:
            layers[:0] = list(c.caches)
        elif kind == layer_caches.APPEND:
            rows = [a for _, a in tree_flatten(c.state) if isinstance(a, mx.array) and a.ndim >= 3]
            per_token += sum(a.nbytes // max(1, a.shape[-2]) for a in rows)
    return per_token
