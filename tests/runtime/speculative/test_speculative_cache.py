"""Speculation composes with the lineage cache: it stores what plain decoding stores.

A two-turn conversation (the second turn restores the first's entry: a warm
restore) runs on two in-process engines, one plain and one speculating with
drafts that are partly wrong (so rollbacks happen around every commit). The
replies, the restore points and every entry the RAM tier holds (tokens,
append-only rows, state snapshots at each checkpoint) must be the same: no
entry or checkpoint holds a rejected token's state.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.local import LocalEngine
from engine.runtime.model.tiny_models import write_model_dir
from engine.runtime.speculative.drafts import ScriptedDrafts
from engine.runtime.speculative.speculative_batch import Speculation
from tests.runtime.speculative.test_rollback import entry_arrays, rel_l2

REL = 1e-5
TOKENS = 24


def _config(model_dir, cache_dir, speculative: str) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(
            path=str(model_dir), max_batch=4, prefill_step_size=64, speculative=speculative
        ),
        cache=CacheConfig(cache_dir=str(cache_dir), ram_budget=1 << 30, guard_min_suffix=64),
    )


def _conversation(engine: LocalEngine, first: list, second: list) -> list:
    one = engine.run(first, max_tokens=TOKENS)
    two = engine.run(first + one.ids + second, max_tokens=TOKENS)
    return [one, two]


def _oracle(replies: dict):
    """Drafts from the plain replies, each guess with one token changed (which moves)."""
    calls = [0]

    def script(uid, context, k):
        calls[0] += 1
        for prompt, reply in replies.items():
            if len(context) >= len(prompt) and tuple(context[: len(prompt)]) == prompt:
                done = len(context) - len(prompt)
                drafts = list(reply[done : done + k])
                wrong = calls[0] % (k + 2)
                if wrong < len(drafts):
                    drafts[wrong] = (drafts[wrong] + 1) % 4000 + 3
                return drafts
        return []

    return ScriptedDrafts(script)


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba2", "gemma3_text"])
def test_speculation_stores_what_plain_decoding_stores(arch, tmp_path):
    model_dir = write_model_dir(arch, tmp_path / "model")
    rng = np.random.default_rng(7)
    first = rng.integers(3, 4000, size=150).tolist()
    second = rng.integers(3, 4000, size=40).tolist()

    plain = LocalEngine(_config(model_dir, tmp_path / "a", "off"))
    want = _conversation(plain, first, second)
    replies = {
        tuple(first): want[0].ids,
        tuple(first + want[0].ids + second): want[1].ids,
    }

    spec = LocalEngine(_config(model_dir, tmp_path / "b", "lookup"))
    batch = spec.generator.bg._generation_batch
    batch.speculation = Speculation(_oracle(replies), 3)
    got = _conversation(spec, first, second)

    assert batch.stats.replayed or batch.stats.accepted_none  # rollbacks happened
    assert sum(t.final.timing.accepted for t in got) > 0
    for g, w in zip(got, want):
        assert g.ids == w.ids
        assert (g.final.restore_kind, g.final.cached_tokens) == (
            w.final.restore_kind,
            w.final.cached_tokens,
        )
    assert sorted(spec.tier.entries) == sorted(plain.tier.entries)
    for entry_id, w in plain.tier.entries.items():
        g = spec.tier.entries[entry_id]
        assert g.length == w.length
        assert np.array_equal(g.tokens[: g.length], w.tokens[: w.length])
        assert sorted(g.states) == sorted(w.states)
        got_arrays = list(entry_arrays((g.layers, g.states)))
        want_arrays = list(entry_arrays((w.layers, w.states)))
        assert len(got_arrays) == len(want_arrays)
        worst = max((rel_l2(a, b) for a, b in zip(got_arrays, want_arrays)), default=0.0)
        assert worst <= REL, (arch, entry_id, worst)
