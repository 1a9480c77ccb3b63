"""How far a restore from a packed checkpoint drifts from an exact one.

Two engines on the same weights, one keeping checkpoints exact and one at the precision
under test, store the same conversation. Both entries are restored at its prompt end;
the exact restore decodes `tokens` greedy tokens, and the packed restore is fed the same
tokens (teacher-forced), so each step compares the two distributions over the same
context: greedy top-1 agreement (the share of steps whose argmax is the same) and the
mean KL(exact || packed), in nats.
"""

from __future__ import annotations

import numpy as np


def _log_softmax(x):
    import mlx.core as mx

    x = x.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def drift(
    model,
    exact_tier,
    exact_id: int,
    packed_tier,
    packed_id: int,
    length: int,
    first: int,
    tokens: int = 256,
) -> dict:
    """Top-1 agreement and mean KL over `tokens` steps after restoring both entries at
    `length` and feeding `first` (the prompt's next token)."""
    import mlx.core as mx

    a = exact_tier.restore(exact_id, length)
    b = packed_tier.restore(packed_id, length)
    token = first
    agree, kls = 0, []
    for _ in range(tokens):
        x = mx.array([[token]])
        la, lb = _log_softmax(model(x, cache=a)[0, -1]), _log_softmax(model(x, cache=b)[0, -1])
        kl = mx.sum(mx.exp(la) * (la - lb))
        top_a, top_b = mx.argmax(la), mx.argmax(lb)
        mx.eval(kl, top_a, top_b)
        agree += int(top_a.item() == top_b.item())
        kls.append(float(kl.item()))
        token = int(top_a.item())
    return {
        "tokens": tokens,
        "top1_agreement": agree / tokens,
        "mean_kl": float(np.mean(kls)),
        "max_kl": float(np.max(kls)),
    }


def measure_drift(config, loaded, prompt: list, precisions, tokens: int = 256) -> dict:
    """precision -> drift against exact, on one conversation of `prompt`."""
    import dataclasses

    from engine.runtime.local import LocalEngine

    def stored(precision: str):
        cache = dataclasses.replace(config.cache, checkpoint_precision=precision)
        engine = LocalEngine(dataclasses.replace(config, cache=cache), loaded)
        r = engine.run(prompt, max_tokens=2, namespace=f"drift-{precision}")
        assert len(prompt) in engine.tier.entries[r.plan.new_entry_id].states
        return engine.tier, r.plan.new_entry_id, r.ids[0]

    exact_tier, exact_id, first = stored("exact")
    out = {}
    for precision in precisions:
        if precision == "exact":
            continue
        tier, entry_id, _ = stored(precision)
        out[precision] = drift(
            loaded[0], exact_tier, exact_id, tier, entry_id, len(prompt), first, tokens
        )
    return out
