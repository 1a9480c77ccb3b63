"""`lineage bench warm`: what a short turn on a long conversation costs.

In one process: grow one conversation to ~8k tokens, then send short turns
(~20 new tokens) and report medians over the turns of
- warm time to first token (plan, restore, batch merge, prefill, first token);
- the bare forward of the same uncached tokens plus one decode step, on the
  same restored cache, measured directly in the same run;
- their ratio (target <= 1.15);
- bytes copied per warm turn (restore and commit, counted by the snapshot
  code; cross-checked with MLX's peak memory) against the restored KV bytes;
- cold time to first token for the same prompt, and warm time to first token
  at 1k context (target: 8k within 1.5x of 1k);
- a verbatim resend of the ~8k conversation (a retry): its time to first token
  and the tokens it prefilled, against one decode step on the same cache
  (target: TTFT <= 1.5x one decode step, zero tokens prefilled);
- the per-forward overhead and per-token cost measured at load, and the guard
  threshold they give.
"""

from __future__ import annotations

import time

from clients.bench.figures import emit, labelled, median
from clients.bench.harness import add_serve_arguments, engine_config

HELP = "time to first token of a short turn on a long conversation"


def _grow(engine, rng, start: int, vocab: int) -> list:
    """A conversation of `start` tokens, prefilled once (its first turn)."""
    tokens = [int(t) for t in rng.integers(10, vocab - 10, size=start)]
    r = engine.run(tokens, max_tokens=4)
    return tokens + r.ids


def _bare_forward_ms(engine, plan, new_tokens: list) -> float:
    """Forward of `new_tokens` on the restored cache, then one decode step (ms)."""
    import mlx.core as mx

    cache = engine.tier.restore(plan.entry_id, plan.length)
    model = engine.model
    mx.eval([c.state for c in cache if hasattr(c, "state")])
    t0 = time.perf_counter()
    logits = model(mx.array([new_tokens]), cache=cache)
    nxt = mx.argmax(logits[:, -1, :], axis=-1)
    mx.eval(nxt)
    logits = model(nxt[:, None], cache=cache)
    mx.eval(logits)
    return (time.perf_counter() - t0) * 1000


def _warm_turns(engine, rng, context: int, turns: int, new: int, vocab: int):
    """`turns` short turns of `new` tokens on a conversation grown to `context`: a row per
    turn, and the last prompt."""
    import mlx.core as mx

    convo = _grow(engine, rng, context, vocab)
    rows = []
    for _ in range(turns):
        added = [int(t) for t in rng.integers(10, vocab - 10, size=new)]
        prompt = convo + added
        mx.reset_peak_memory()
        active = mx.get_active_memory()
        r = engine.run(prompt, max_tokens=2)
        peak_delta = mx.get_peak_memory() - active
        if r.final.restore_length == 0:
            raise RuntimeError(f"warm turn at {len(prompt)} tokens missed the cache")
        # The same restore point the turn used is still stored (now a checkpoint
        # of the new entry, or the anchor/entry itself): time the bare forward.
        plan = _replan(engine, r)
        uncached = prompt[r.final.restore_length :]
        fwd = _bare_forward_ms(engine, plan, uncached)
        t = r.final.timing
        rows.append(
            {
                "prompt_tokens": len(prompt),
                "cached_tokens": r.final.cached_tokens,
                "uncached_tokens": len(uncached),
                "restore_kind": r.final.restore_kind,
                "warm_ttft_ms": r.ttft_ms,
                "forward_ms": fwd,
                "bytes_copied_restore": t.bytes_copied_restore,
                "bytes_copied_commit": t.bytes_copied_commit,
                "bytes_copied_batch": t.bytes_copied_batch,
                "restored_kv_bytes": t.restored_kv_bytes,
                "peak_memory_delta": peak_delta,
            }
        )
        convo = prompt + r.ids
    return rows, prompt


def _resend(engine, prompt: list, repeats: int = 3) -> dict:
    """A verbatim resend of `prompt` (a retry): TTFT, tokens prefilled, one decode step."""
    import mlx.core as mx

    rows = []
    for _ in range(repeats):
        before = engine.generator.bg._counters.prompt_tokens
        r = engine.run(prompt, max_tokens=2)
        prefilled = engine.generator.bg._counters.prompt_tokens - before
        cache = engine.tier.restore(r.plan.new_entry_id, len(prompt))  # its prompt end
        mx.eval([c.state for c in cache if hasattr(c, "state")])
        t0 = time.perf_counter()
        mx.eval(engine.model(mx.array([[int(r.ids[0])]]), cache=cache))
        step = (time.perf_counter() - t0) * 1000
        rows.append((r.ttft_ms, step, prefilled, r.final.cached_tokens, r.final.restore_kind))
    return {
        "resend_ttft_ms": median(x[0] for x in rows),
        "decode_step_ms": median(x[1] for x in rows),
        "resend_prefilled_tokens": max(x[2] for x in rows),
        "resend_cached_tokens": min(x[3] for x in rows),
        "resend_prompt_tokens": len(prompt),
        "resend_kind": rows[-1][4],
    }


def _replan(engine, r):
    """A plan restoring the prefix the turn restored, from what the tier holds now."""
    from dataclasses import replace

    n = r.final.restore_length
    for entry_id, entry in engine.tier.entries.items():
        if n <= entry.length and (n in entry.states or not engine.info.has_state_layers):
            return replace(r.plan, entry_id=entry_id, length=n)
    raise RuntimeError("the restore point used by the turn is gone")


def run_bench(
    config,
    context: int = 8192,
    small_context: int = 1024,
    turns: int = 5,
    new_tokens: int = 20,
    seed: int = 0,
) -> dict:
    import numpy as np

    from engine.runtime.local import LocalEngine

    engine = LocalEngine(config)
    vocab = engine.info.vocab_size
    rng = np.random.default_rng(seed)
    _warm_turns(engine, rng, 256, 1, new_tokens, vocab)  # warm up MLX kernels
    rows, last_prompt = _warm_turns(engine, rng, context, turns, new_tokens, vocab)
    rows_1k, _ = _warm_turns(engine, rng, small_context, turns, new_tokens, vocab)
    resend = _resend(engine, last_prompt)
    cold = [engine.run(last_prompt, max_tokens=1, cold=True).ttft_ms for _ in range(2)]

    def med(key: str, rs: list = rows) -> float:
        return median(r[key] for r in rs)

    out = {
        "model": engine.info.path,
        "context_tokens": rows[-1]["prompt_tokens"],
        "turns": turns,
        "new_tokens_per_turn": new_tokens,
        "warm_ttft_ms": med("warm_ttft_ms"),
        "forward_ms": med("forward_ms"),
        "cold_ttft_ms": median(cold),
        "warm_ttft_1k_ms": med("warm_ttft_ms", rows_1k),
        "forward_1k_ms": med("forward_ms", rows_1k),
        "bytes_copied_restore": med("bytes_copied_restore"),
        "bytes_copied_commit": med("bytes_copied_commit"),
        "bytes_copied_batch": med("bytes_copied_batch"),
        "restored_kv_bytes": med("restored_kv_bytes"),
        "peak_memory_delta": med("peak_memory_delta"),
        "pool_clears": engine.generator.bg.pool.count,
        "forward_overhead_ms": engine.info.forward_ms,
        "token_ms": engine.info.token_ms,
        "guard_min_suffix": engine.manager.config.guard_min_suffix,
        **resend,
        "turn_rows": rows,
    }
    out["resend_to_decode"] = out["resend_ttft_ms"] / out["decode_step_ms"]
    out["ratio"] = out["warm_ttft_ms"] / out["forward_ms"]
    out["ratio_8k_to_1k"] = out["warm_ttft_ms"] / out["warm_ttft_1k_ms"]
    out["forward_8k_to_1k"] = out["forward_ms"] / out["forward_1k_ms"]
    out["cold_to_warm"] = out["cold_ttft_ms"] / out["warm_ttft_ms"]
    return out


def report(out: dict) -> str:
    rows = [
        ("model", out["model"]),
        (
            "context",
            f"{out['context_tokens']} tokens, {out['turns']} turns of "
            f"{out['new_tokens_per_turn']} new tokens (medians)",
        ),
        ("warm ttft", f"{out['warm_ttft_ms']:.1f} ms"),
        ("forward (+1 decode)", f"{out['forward_ms']:.1f} ms"),
        ("ratio", f"{out['ratio']:.2f}   (target <= 1.15)"),
        ("cold ttft", f"{out['cold_ttft_ms']:.1f} ms   ({out['cold_to_warm']:.1f}x warm)"),
        (
            "warm ttft at 1k",
            f"{out['warm_ttft_1k_ms']:.1f} ms   (8k/1k = {out['ratio_8k_to_1k']:.2f}, target "
            f"<= 1.5; the bare forward alone scales {out['forward_8k_to_1k']:.2f}x: "
            f"{out['forward_1k_ms']:.1f} ms at 1k)",
        ),
        (
            "bytes copied/turn",
            f"restore {out['bytes_copied_restore']:.0f}, commit "
            f"{out['bytes_copied_commit']:.0f}, batch {out['bytes_copied_batch']:.0f}; "
            f"restored KV {out['restored_kv_bytes']:.0f} "
            f"(the batch merge copies it once; a sequence finishing alone leaves with views "
            f"of its rows, so the commit copies none)",
        ),
        ("peak memory delta", f"{out['peak_memory_delta']:.0f} bytes per warm turn"),
        ("pool clears", f"{out['pool_clears']}"),
        (
            "verbatim resend",
            f"{out['resend_ttft_ms']:.1f} ms ttft at {out['resend_prompt_tokens']} tokens "
            f"({out['resend_kind']}, {out['resend_cached_tokens']} cached, "
            f"{out['resend_prefilled_tokens']} prefilled); one decode step "
            f"{out['decode_step_ms']:.1f} ms; ratio {out['resend_to_decode']:.2f}   "
            f"(target <= 1.5, 0 prefilled)",
        ),
        (
            "guard threshold",
            f"{out['guard_min_suffix']} tokens (a forward costs "
            f"{out['forward_overhead_ms']:.2f} ms beyond its tokens, a token "
            f"{out['token_ms']:.3f} ms)",
        ),
    ]
    return "\n".join(labelled(rows, 22))


def add_arguments(p) -> None:
    add_serve_arguments(p)
    p.add_argument("--context", type=int, default=8192, help="conversation length")
    p.add_argument("--turns", type=int, default=5, help="short turns (medians over them)")
    p.add_argument("--new-tokens", type=int, default=20, help="new tokens per short turn")
    p.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    out = run_bench(
        engine_config(args), context=args.context, turns=args.turns, new_tokens=args.new_tokens
    )
    return emit(out, args, report)
