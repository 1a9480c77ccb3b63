"""The cache under pressure, through the running server: real gRPC, Ray, MLX and entry files.

Four conversations take turns while the RAM budget holds about two of them, so
each one is evicted (its file stays) and read back from disk at its next turn.
Every later turn restores at least 80% of its previous prompt, from RAM or
disk, and no restore is lost: none silently cold.
"""

from __future__ import annotations

from clients.client import Client
from clients.fanout import make_shared_prefix, user_message
from engine.server.running.background import BackgroundEngine
from tests.engines import make_config

SYSTEM, TOOLS = make_shared_prefix(600, seed=21)


def conversation_bytes(model_cache_dir, model, prompt_tokens: int) -> int:
    """RAM bytes of one stored conversation of this length on `model`."""
    from engine.runtime import layer_caches
    from engine.runtime.local import LocalEngine

    local = LocalEngine(make_config(model_cache_dir, model=model))
    local.run(list(range(100, 100 + prompt_tokens)), max_tokens=4)
    stored = max(local.tier.entries.values(), key=lambda e: e.length)
    state = max(s.nbytes for s in stored.states.values())
    return layer_caches.kv_bytes_per_token(stored.layers) * (prompt_tokens + 40) + 4 * state


def test_four_conversations_cycle_through_a_budget_of_two(
    ray_session, model_cache_dir, random_model_dir, tmp_path
):
    # The random-weight qwen3_next: eviction and disk reloads need a hybrid model, not
    # the trained one's predictions.
    one = conversation_bytes(model_cache_dir, random_model_dir, 900)
    config = make_config(tmp_path, model=random_model_dir).with_cache(ram_budget=int(2.5 * one))
    # Four sessions of their own (a system prompt each): sessions on one system prompt
    # would hold its rows once, and four would fit where two of these do.
    messages = [
        [
            {"role": "system", "content": f"Session {c}.\n{SYSTEM}"},
            {"role": "user", "content": user_message(c, 0)},
        ]
        for c in range(4)
    ]
    previous = [0] * 4
    engine = BackgroundEngine(config)
    try:
        with Client(engine.address, timeout=120) as client:
            for turn in range(3):
                for c in range(4):
                    r = client.generate(messages=messages[c], tools=TOOLS, max_tokens=4)
                    if turn:
                        assert r.restore.kind != "none", (turn, c, r.restore)
                        assert r.usage.cached_tokens >= 0.8 * previous[c], (turn, c, r.usage)
                    previous[c] = r.usage.prompt_tokens
                    messages[c] += [
                        {"role": "assistant", "content": r.text},
                        {"role": "user", "content": user_message(c, turn + 1)},
                    ]
            stats = client.cache_stats()
        assert stats.get("restores_lost", 0) == 0, stats
        assert stats["evictions"] > 0, "the budget did not hold two conversations only"
        assert engine.generator_stats().disk["loads"] >= 4, "turns were read back from disk"
    finally:
        engine.stop()
