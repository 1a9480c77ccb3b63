"""`lineage bench kernels`' sparse-attention part: one DSA layer, stock against ours.

mlx-lm's ``DeepseekV32Attention`` with random weights (no model load) and
``index_topk`` scaled so the context is 8x it, its cache filled to a long
context: ms per forward of a chunk of L tokens on that cache, for each L,
mlx-lm's stock call against engine/kernels' (`layer_bench`), the path ours
took, the union of selected blocks for block-gather lengths, and the relative
L2 between the two. `Clustering` gives the indexer the selections of a trained
model (sinks, a recent window, topic spans), where block-gather pays; random
weights' selections cover the whole context.

Cheap to import: MLX and mlx-lm are imported inside the functions.
"""

from __future__ import annotations

import contextlib

from clients.bench.figures import median_ms

CHUNKS = (1, 2, 16, 64, 128, 256, 512, 1024)


def layer(context: int, heads: int, seed: int):
    """A random-weight DSA attention layer (DeepSeek-V3.2 per-head dims, fewer heads)."""
    import mlx.core as mx
    from mlx_lm.models.deepseek_v32 import DeepseekV32Attention, ModelArgs

    args = ModelArgs(
        hidden_size=1024,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        q_lora_rank=512,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        index_n_heads=max(1, heads // 2),  # V3.2: 128 heads over 64 indexer heads
        index_head_dim=128,
        index_topk=context // 8,
        max_position_embeddings=4 * context,
    )
    mx.random.seed(seed)
    attn = DeepseekV32Attention(args)
    mx.eval(attn.parameters())
    return attn


def filled_cache(attn, context: int, seed: int, hot=None):
    """The layer's cache after `context` tokens of random hidden states.

    Written with the layer's own projections, norms and rope, chunk by chunk,
    without attending (the attention output of the prefix is not needed).
    `hot` (a `Clustering`) adds its shared component to the hidden states of
    its hot positions.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import CacheList, KVCache

    cache = CacheList(KVCache(), KVCache())
    mx.random.seed(seed)
    for start in range(0, context, 2048):
        x = mx.random.normal((1, min(2048, context - start), attn.hidden_size))
        B, L, _ = x.shape
        if hot is not None:
            x = x + hot.offset(start, L)
        ckv, k_pe = mx.split(attn.kv_a_proj_with_mqa(x), [attn.kv_lora_rank], axis=-1)
        k_pe = attn.rope(k_pe.reshape(B, L, 1, -1).transpose(0, 2, 1, 3), cache[0].offset)
        latent = mx.expand_dims(attn.kv_a_layernorm(ckv), axis=1)
        cache[0].update_and_fetch(latent, k_pe)
        ix = attn.indexer
        k = ix.rope(ix.k_norm(ix.wk(x)).reshape(B, 1, L, -1), offset=cache[1].offset)
        cache[1].update_and_fetch(k, mx.zeros_like(k))
        mx.eval([c.state for c in cache.caches])
    return cache


class Clustering:
    """Indexer selections that cluster, as a trained DSA model's do.

    With random weights every query's top-k is spread over the whole context,
    so the union of a chunk's selected blocks is all of it and block-gather
    never pays. A trained indexer keeps to attention sinks, a recent window
    and a few topic spans, and neighbouring queries agree. This builds that
    from the layer's own modules: a shared direction `e` in the hidden states
    of the *hot* tokens (the first block, the last `topk // 2` positions, and
    random 64-token blocks up to 1.25x topk in all) and of every chunk token;
    the indexer's parameters are shifted so that tokens carrying `e` get
    positive head weights, queries and keys share a direction `u` outside the
    rope dims, and so score each other highly. Nothing else in the layer
    changes; the forward runs unmodified code on these weights and inputs.
    """

    STRENGTH = 8.0  # the shared component's norm (a random hidden state's is ~sqrt(hidden))

    def __init__(self, attn, context: int, seed: int):
        import mlx.core as mx
        import numpy as np

        ix = attn.indexer
        mx.random.seed(seed)
        e = mx.random.normal((attn.hidden_size,))
        self.e = e / mx.linalg.norm(e)
        v = mx.random.normal((ix.head_dim - ix.rope_head_dim,))
        v = (v - v.mean()) / mx.linalg.norm(v - v.mean())  # zero mean: survives k_norm
        u = mx.concatenate([mx.zeros((ix.rope_head_dim,)), v])  # outside the rope dims
        g = attn.q_a_proj(self.e[None])[0]
        g = g / mx.linalg.norm(g)  # the direction e takes after q_a_proj
        ix.weights_proj.weight = ix.weights_proj.weight + self.e[None, :]
        wq = ix.wq_b.weight.reshape(ix.n_heads, ix.head_dim, -1)
        ix.wq_b.weight = (wq + 2.0 * u[None, :, None] * g[None, None, :]).reshape(
            ix.n_heads * ix.head_dim, -1
        )
        ix.wk.weight = ix.wk.weight + (20.0 / self.STRENGTH) * u[:, None] * self.e[None, :]
        mx.eval(attn.parameters())

        topk, block = ix.index_topk, 64
        rng = np.random.default_rng(seed)
        hot = np.zeros(context, dtype=bool)
        hot[:block] = True  # attention sinks
        hot[context - topk // 2 :] = True  # the recent window
        n_blocks = context // block
        inner = np.arange(1, n_blocks - topk // 2 // block)
        spans = (int(1.25 * topk) - int(hot.sum())) // block
        for b in rng.choice(inner, size=max(0, min(spans, inner.size)), replace=False):
            hot[b * block : (b + 1) * block] = True
        self.hot = hot

    def offset(self, start: int, length: int):
        """The shared component for positions start..start+length of the context."""
        import mlx.core as mx

        hot = mx.array(self.hot[start : start + length].astype("float32"))
        return self.STRENGTH * hot[None, :, None] * self.e

    def chunk(self, x):
        """A chunk's hidden states: every new token carries the shared component."""
        return x + self.STRENGTH * self.e


def _view(cache):
    """A cache over the same rows that the forward can append to without touching `cache`."""
    from mlx_lm.models.cache import CacheList, KVCache

    out = CacheList(KVCache(), KVCache())
    for mine, theirs in zip(out.caches, cache.caches):
        n = theirs.offset
        mine.keys, mine.values = theirs.keys[..., :n, :], theirs.values[..., :n, :]
        mine.offset = n
    return out


def layer_bench(
    context: int,
    heads: int,
    repeats: int,
    chunks=CHUNKS,
    seed: int = 0,
    clustered: bool = False,
    both_paths: bool = False,
) -> dict:
    """ms per forward, stock against ours, per chunk length (module doc).

    `clustered` builds the layer and cache with `Clustering`; `both_paths`
    also times, for chunks in the block-gather range, the path the router
    did not take (block-gather or the decode shape) on its own.
    """
    import mlx.nn as nn

    from engine.kernels import sparse_attention as sa

    attn = layer(context, heads, seed)
    hot = Clustering(attn, context, seed + 2) if clustered else None
    cache = filled_cache(attn, context, seed + 1, hot)
    sa.install(nn.Sequential(attn), sa.SparseRouting())
    rows = [_chunk_row(attn, cache, hot, L, seed + L, repeats, both_paths) for L in chunks]
    return {
        "context": context,
        "index_topk": attn.indexer.index_topk,
        "heads": heads,
        "index_heads": attn.indexer.n_heads,
        "kv_lora_rank": attn.kv_lora_rank,
        "repeats": repeats,
        "selections": "clustered" if clustered else "random",
        "rows": rows,
    }


def _chunk_row(attn, cache, hot, L: int, seed: int, repeats: int, both_paths: bool) -> dict:
    """One chunk of L tokens on the cache: stock and ours timed, the path ours took, their
    relative L2, the block union; with `both_paths`, the path not taken, forced."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask

    from engine.kernels import sparse_attention as sa

    mx.random.seed(seed)
    x = mx.random.normal((1, L, attn.hidden_size))
    if hot is not None:
        x = hot.chunk(x)
    mx.eval(x)

    def forward(call):
        c = _view(cache)
        out = call(x, create_attention_mask(x, c[0], return_array=True), c)
        mx.eval(out)
        return out

    stock_out, before = forward(attn._stock_call), dict(sa.ROUTED)
    ours_out = forward(attn)
    path = next(k for k, v in sa.ROUTED.items() if v != before.get(k, 0))
    rel, union = _rel(ours_out, stock_out), _union_fraction(attn, x, cache, L)
    stock_ms = median_ms(lambda: forward(attn._stock_call), repeats)
    ours_ms = median_ms(lambda: forward(attn), repeats)
    row = {
        "chunk": L,
        "stock_ms": stock_ms,
        "ours_ms": ours_ms,
        "speedup": stock_ms / ours_ms,
        "path": path,
        "rel_l2": rel,
        "block_union": union,
    }
    routing = sa.SparseRouting()
    if both_paths and routing.decode_max < L <= routing.gather_max:
        other = "decode" if path == "gather" else "gather"
        with _forced(sa, other):
            taken = sa.ROUTED[other]
            forced_out = forward(attn)
            assert sa.ROUTED[other] == taken + 1, (other, dict(sa.ROUTED))
            row["forced"] = {
                "path": other,
                "ms": median_ms(lambda: forward(attn), repeats),
                "rel_l2": _rel(forced_out, stock_out),
            }
    forced = row.get("forced")
    print(
        f"  L={L:5d}  stock {stock_ms:9.1f} ms  ours {ours_ms:9.1f} ms  "
        f"x{stock_ms / ours_ms:6.2f}  {path:6s}  rel L2 {rel:.1e}"
        + (f"  {forced['path']} alone {forced['ms']:9.1f} ms" if forced else ""),
        flush=True,
    )
    return row


def _rel(a, b) -> float:
    import mlx.core as mx

    return (mx.linalg.norm((a - b).flatten()) / mx.linalg.norm(b.flatten())).item()


@contextlib.contextmanager
def _forced(sa, path: str):
    """Within: chunks in the block-gather range take `path` ("decode" or "gather")."""
    pays = sa.gather_pays
    sa.gather_pays = lambda *a: path == "gather"
    try:
        yield
    finally:
        sa.gather_pays = pays


def _union_fraction(attn, x, cache, L: int) -> float | None:
    """Share of the context's 64-token blocks the chunk's queries select (block-gather sizes)."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask

    from engine.kernels import sparse_attention as sa

    if not 128 < L <= 512:
        return None
    c = _view(cache)
    mask = create_attention_mask(x, c[0], return_array=True)
    qr = attn.q_a_layernorm(attn.q_a_proj(x))
    topk = attn.indexer(x, qr, mask, cache=c[1])
    n = c[1].offset
    blocks = sa.selected_blocks(topk, n, 64)
    mx.eval(blocks)
    return blocks.shape[1] / -(-n // 64)
