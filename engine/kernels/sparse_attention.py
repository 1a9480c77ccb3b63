"""DSA sparse attention for short chunks: the decode shape and block-gather.

mlx-lm's ``DeepseekV32Attention`` (deepseek_v32, and glm_moe_dsa, which reuses
it) has two paths once the context is longer than ``index_topk``. One token
gathers its top-k latent keys and attends over them in the absorbed form. More
than one token builds a dense mask over the whole context and expands the
latent KV of the *entire* context into per-head keys and values on every
forward: a warm turn of a few dozen tokens at 20k context pays that expansion
in every sparse layer. This module adds two paths in between, chosen per
forward by the chunk length ``L``:

- **decode shape** (``1 < L <= decode_max``): every query gathers its own
  indexer top-k latent keys and rope keys and attends in the absorbed form,
  all heads at once; the queries go in cache-sized pieces spread over the
  CPU streams (`cpu_streams`). Causality inside the chunk and left padding
  come from the same mask the stock path uses, gathered at the top-k
  positions.
- **block-gather** (``decode_max < L <= gather_max``): the union of the
  ``block``-token blocks any query of the chunk selects is gathered, only those
  rows are expanded into per-head keys and values, and the sparse mask is
  restricted to them. When the union is too wide for that to cost less than
  the decode shape (`gather_pays`), the chunk takes the decode shape.
- **stock**: ``L == 1``, longer chunks, contexts no longer than
  ``index_topk`` (the indexer selects nothing), quantized KV, no cache.

Both new paths take the indexer's top-k from `indexer.topk` (mlx-lm's
indexer, bit for bit, faster on the CPU). The decode shape is a different
association of the MLA absorb, equal to the stock path to about 1e-6
relative L2 in float32, not bit-identical; block-gather computes what the
stock path computes on the rows it keeps.

Installed by swapping each attention module's class for a subclass whose
``__call__`` routes the chunk and calls mlx-lm's own ``__call__`` for the stock
path (mlx-lm's file is not copied). The parameter tree is unchanged. This
module knows mlx-lm's attention module and its caches; it knows nothing of
the engine's configuration, batching or serving.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.deepseek_v32 import DeepseekV32Attention

from engine.kernels import indexer
from engine.kernels.cpu_streams import on, streams

DECODE_SHAPE = "dsa-decode-shape"
BLOCK_GATHER = "dsa-block-gather"
# The decode shape gathers each query's own rows; it goes in pieces of queries
# whose gathered rows stay under this many bytes, so a piece's rows are still
# in the CPU's cache when its two matmuls read them (8 MB: 2 queries of
# DeepSeek-V3.2's top-2048; measured fastest among 1 to 128 queries here).
GATHER_BYTES = 1 << 23
# Forwards routed to each path since import ("stock", "decode", "gather"): the
# tests and the benchmark read it to know which path ran.
ROUTED: Counter = Counter()


@dataclass(frozen=True)
class SparseRouting:
    """Chunk lengths routed to each path (stock outside them)."""

    decode_max: int = 128  # 1 < L <= decode_max: decode shape
    gather_max: int = 512  # decode_max < L <= gather_max: block-gather
    block: int = 64  # block-gather granularity, in tokens

    def __post_init__(self):
        if not 1 <= self.decode_max <= self.gather_max:
            raise ValueError(
                f"sparse thresholds: need 1 <= decode_max ({self.decode_max}) "
                f"<= gather_max ({self.gather_max})"
            )
        if self.block < 1:
            raise ValueError(f"sparse block size {self.block} must be positive")

    def path(self, chunk: int, context: int, topk: int) -> str:
        """'decode', 'gather' or 'stock' for a chunk of `chunk` tokens ending at `context`."""
        if chunk <= 1 or context <= topk or chunk > self.gather_max:
            return "stock"
        return "decode" if chunk <= self.decode_max else "gather"


def _cache_length(cache) -> int:
    """Rows the KV cache holds before this forward (batch caches count left padding)."""
    return int(cache._idx) if hasattr(cache, "_idx") else int(cache.offset)


def _sparse_call(self, x: mx.array, mask=None, cache=None) -> mx.array:
    """DeepseekV32Attention.__call__ with the short-chunk paths routed in (module doc)."""
    B, L, _ = x.shape
    if cache is None or hasattr(cache[0], "bits") or not isinstance(mask, (mx.array, type(None))):
        return self._stock_call(x, mask, cache)
    context = _cache_length(cache[0]) + L
    path = self._sparse_routing.path(L, context, self.indexer.index_topk)
    if path == "stock":
        ROUTED[path] += 1
        return self._stock_call(x, mask, cache)

    # mlx-lm's projections, rope and cache updates, as in DeepseekV32Attention.
    qr = self.q_a_layernorm(self.q_a_proj(x))
    q = self.q_b_proj(qr).reshape(B, L, self.num_heads, self.q_head_dim).transpose(0, 2, 1, 3)
    q_nope, q_pe = mx.split(q, [self.qk_nope_head_dim], axis=-1)
    compressed_kv = self.kv_a_proj_with_mqa(x)
    compressed_kv, k_pe = mx.split(compressed_kv, [self.kv_lora_rank], axis=-1)
    k_pe = k_pe.reshape(B, L, 1, self.qk_rope_head_dim).transpose(0, 2, 1, 3)
    kv_latent = mx.expand_dims(self.kv_a_layernorm(compressed_kv), axis=1)
    offset = cache[0].offset
    q_pe = self.rope(q_pe, offset)
    k_pe = self.rope(k_pe, offset)
    kv_latent, k_pe = cache[0].update_and_fetch(kv_latent, k_pe)
    topk = indexer.topk(self.indexer, x, qr, mask, cache[1])
    assert topk is not None, (context, kv_latent.shape)
    topk = mx.stop_gradient(topk)
    cache[0].keys = mx.depends(cache[0].keys, (cache[1].keys, cache[1].values))

    if path == "gather":
        block = self._sparse_routing.block
        blocks = selected_blocks(topk, kv_latent.shape[2], block)
        if not gather_pays(self, blocks.shape[1] * block, L, topk.shape[-1]):
            path = "decode"  # the union is too wide to save anything over the decode shape
    ROUTED[path] += 1
    if path == "decode":
        out = decode_shape(self, q_nope, q_pe, kv_latent, k_pe, topk, mask)
    else:
        out = block_gather(self, q_nope, q_pe, kv_latent, k_pe, topk, mask, blocks, block)
    return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def _rows(source: mx.array, index: mx.array) -> mx.array:
    """source (B, 1, N, D), index (B, M) -> source's rows at index, (B, M, D)."""
    B, _, N, D = source.shape
    flat = (index + (mx.arange(B) * N)[:, None]).reshape(-1)
    return mx.take(source.reshape(B * N, D), flat, axis=0).reshape(B, -1, D)


def _masked(scores: mx.array, keep: mx.array | None) -> mx.array:
    if keep is None:
        return scores
    return mx.where(keep, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))


def decode_shape(attn, q_nope, q_pe, kv_latent, k_pe, topk, mask) -> mx.array:
    """Each query attends over its own top-k latent keys, absorbed -> (B, H, L, v_head_dim).

    q_nope (B, H, L, Dn), q_pe (B, H, L, P) roped; kv_latent (B, 1, N, R) and
    k_pe (B, 1, N, P) the whole cache; topk (B, 1, L, K) the indexer's choice;
    mask None or broadcastable to (B, 1, L, N). Per query, its K rows are
    gathered once and serve both products, all heads at once: scores
    (K, H) = rows @ q^T and output (H, R) = softmax(scores)^T @ rows, the
    layouts MLX's CPU matmul runs fastest. The queries go in pieces whose
    gathered rows stay under GATHER_BYTES, spread over the CPU streams.
    """
    B, H, L, _ = q_nope.shape
    N, R = kv_latent.shape[2], kv_latent.shape[-1]
    K = topk.shape[-1]
    piece = max(1, GATHER_BYTES // (K * (R + k_pe.shape[-1]) * kv_latent.itemsize))
    # (B, L, D, H): each query's heads side by side, the scale folded in.
    q_abs = mx.contiguous((attn.embed_q(q_nope) * attn.scale).transpose(0, 2, 3, 1))
    q_rope = mx.contiguous((q_pe * attn.scale).transpose(0, 2, 3, 1))
    keep = None
    if mask is not None:
        mask = mx.broadcast_to(mask, (B, 1, L, N))
        keep = mx.take_along_axis(mask, topk, axis=-1)[:, 0, :, :, None]  # (B, L, K, 1)
    workers, outs = streams(), []
    for b in range(B):
        latent, rope_keys = kv_latent[b, 0], k_pe[b, 0]  # (N, R), (N, P): views
        for s in range(0, L, piece):
            e = min(L, s + piece)
            with on(workers[len(outs) % len(workers)]):
                outs.append(
                    _decode_piece(
                        latent,
                        rope_keys,
                        topk[b, 0, s:e],
                        q_abs[b, s:e],
                        q_rope[b, s:e],
                        None if keep is None else keep[b, s:e],
                    )
                )
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)
    out = out.reshape(B, L, H, R).transpose(0, 2, 1, 3)
    return attn.unembed_out(out)


def _decode_piece(latent, rope_keys, topk, q_abs, q_rope, keep) -> mx.array:
    """`decode_shape` for Q queries of one row, before the unembed -> (Q, H, R).

    latent (N, R), rope_keys (N, P); topk (Q, K); q_abs (Q, R, H), q_rope
    (Q, P, H) scaled; keep None or (Q, K, 1).
    """
    Q, K = topk.shape
    index = topk.reshape(-1)
    rows = mx.take(latent, index, axis=0).reshape(Q, K, -1)  # (Q, K, R)
    scores = rows @ q_abs + mx.take(rope_keys, index, axis=0).reshape(Q, K, -1) @ q_rope
    probs = mx.softmax(_masked(scores, keep).swapaxes(1, 2), axis=-1)  # (Q, H, K)
    return probs @ rows


def selected_blocks(topk: mx.array, context: int, block: int) -> mx.array:
    """(B, M) ids of the blocks any query of each row selects, ascending, padded.

    M is the largest count over the rows; a shorter row is padded with blocks
    nobody selected (they stay masked). Evaluates the union to learn M.
    """
    B = topk.shape[0]
    n_blocks = -(-context // block)
    hit = mx.zeros((B, n_blocks), dtype=mx.bool_)
    hit = mx.put_along_axis(hit, (topk.reshape(B, -1) // block), mx.array(True), axis=-1)
    width = int(hit.sum(axis=-1).max().item())
    ids = mx.arange(n_blocks)
    order = mx.argsort(mx.where(hit, ids, ids + n_blocks), axis=-1)
    return order[:, :width]


def gather_pays(attn, rows: int, chunk: int, topk: int) -> bool:
    """Whether attending over `rows` gathered rows costs less than the decode shape.

    Multiply-adds per head: block-gather expands each row into a key and a
    value and attends every query to it; the decode shape attends every query
    to its own top-k in the latent width (scores and output) plus rope.
    """
    R, P = attn.kv_lora_rank, attn.qk_rope_head_dim
    Dn, Dv = attn.qk_nope_head_dim, attn.v_head_dim
    gather = rows * (R * (Dn + Dv) + chunk * (Dn + P + Dv))
    return gather < chunk * topk * (2 * R + P)


def block_gather(attn, q_nope, q_pe, kv_latent, k_pe, topk, mask, blocks, block: int):
    """Attention over the union of the selected blocks only -> (B, H, L, v_head_dim).

    Shapes as in `decode_shape`; blocks (B, M) from `selected_blocks`. Only
    the gathered rows are expanded into per-head keys and values; the sparse
    mask is the stock one restricted to them (rows past the context, in the
    last partial block, are masked).
    """
    B, H, L, _ = q_nope.shape
    N = kv_latent.shape[2]
    positions = (blocks[:, :, None] * block + mx.arange(block)).reshape(B, -1)
    inside = positions < N
    positions = mx.minimum(positions, N - 1)
    latent = _rows(kv_latent, positions)[:, None]  # (B, 1, M, R)
    rope_keys = _rows(k_pe, positions)[:, None]  # (B, 1, M, P)

    sparse = mx.zeros((B, 1, L, N), dtype=mx.bool_)
    sparse = mx.put_along_axis(sparse, topk, mx.array(True), axis=-1)
    if mask is not None:
        sparse = sparse & mask
    at = mx.broadcast_to(positions[:, None, None, :], (B, 1, L, positions.shape[-1]))
    keep = mx.take_along_axis(sparse, at, axis=-1) & inside[:, None, None, :]

    # Spread over the CPU streams: the expansion by rows, the attention by queries.
    workers = streams()
    keys, values = [], []
    for stream, (s, e) in zip(workers, _split(latent.shape[2], len(workers))):
        with on(stream):
            keys.append(attn.embed_q(latent[:, :, s:e], transpose=False))  # (B, H, m, Dn)
            values.append(attn.unembed_out(latent[:, :, s:e]))  # (B, H, m, Dv)
    keys, values = _joined(keys, axis=2), _joined(values, axis=2)
    outs = []
    for stream, (s, e) in zip(workers, _split(L, len(workers))):
        with on(stream):
            pe_scores = (q_pe[:, :, s:e] * attn.scale) @ rope_keys.swapaxes(-1, -2)
            outs.append(
                mx.fast.scaled_dot_product_attention(
                    q_nope[:, :, s:e],
                    keys,
                    values,
                    scale=attn.scale,
                    mask=_masked(pe_scores, keep[:, :, s:e]),
                )
            )
    return _joined(outs, axis=2)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """(start, end) of at most `parts` near-equal pieces of range(n)."""
    size = -(-n // parts)
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _joined(arrays: list, axis: int) -> mx.array:
    return arrays[0] if len(arrays) == 1 else mx.concatenate(arrays, axis=axis)


_SPARSE_CLASSES: dict[type, type] = {}


def _sparse_class(base: type) -> type:
    if base not in _SPARSE_CLASSES:
        _SPARSE_CLASSES[base] = type(
            f"Sparse{base.__name__}",
            (base,),
            {"__call__": _sparse_call, "_stock_call": base.__call__, "_stock_class": base},
        )
    return _SPARSE_CLASSES[base]


def sparse_modules(model) -> list:
    """The model's DeepseekV32Attention modules (installed or not)."""
    return [m for m in model.modules() if isinstance(m, DeepseekV32Attention)]


def install(model, routing: SparseRouting) -> int:
    """Route the model's DSA attention through the short-chunk paths; returns the layer count."""
    modules = sparse_modules(model)
    for module in modules:
        if type(module) not in _SPARSE_CLASSES.values():
            module.__class__ = _sparse_class(type(module))
        module._sparse_routing = routing
    return len(modules)


def uninstall(model) -> None:
    """Restore mlx-lm's own attention class on every installed module."""
    for module in sparse_modules(model):
        stock = getattr(type(module), "_stock_class", None)
        if stock is not None:
            module.__class__ = stock
