"""Admission by tokens in the model loop (`max_batch_tokens`): a request that does not fit
beside the running ones waits, in order, and runs once they leave room; none fails
(real MLX, no Ray). The front end's refusal of a request that alone needs more is in
tests/server/test_server.py."""

from __future__ import annotations

import numpy as np

from engine.cache.messages import PlanRequest
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.admission import Wait
from engine.runtime.events import Finished, FinishReason, Tokens
from engine.runtime.local import LocalEngine
from engine.runtime.requests import GenerationRequest, SamplingParams


def _engine(model_cache_dir, model_dir) -> LocalEngine:
    """On the random-weight qwen3_next: admission needs a hybrid model, not the trained
    one's predictions."""
    return LocalEngine(
        EngineConfig(
            model=ModelConfig(path=str(model_dir), prefill_step_size=128, max_batch=8),
            cache=CacheConfig(cache_dir=str(model_cache_dir), ram_budget=1 << 30, mode="off"),
        )
    )


def _submit(engine: LocalEngine, rid: str, tokens: list, max_tokens: int) -> list:
    plan = engine.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32)))
    events: list = []
    sampling = SamplingParams(max_tokens=max_tokens)
    req = GenerationRequest(rid, "", tuple(tokens), plan, sampling, 0.0, 0.0)
    engine.generator.submit(req, events.append)
    return events


def _done(events: list) -> Finished | None:
    return next((e for e in events if isinstance(e, Finished)), None)


def _ids(events: list) -> list:
    return [i for e in events if isinstance(e, Tokens) for i in e.ids]


def test_a_request_over_the_token_budget_waits_for_room_and_then_runs(
    model_cache_dir, random_model_dir
):
    engine = _engine(model_cache_dir, random_model_dir)
    g = engine.generator
    prompts = [[(i * 7 + k) % 2000 + 20 for i in range(40)] for k in range(3)]
    alone = []
    for k, p in enumerate(prompts):
        events = _submit(engine, f"alone-{k}", p, 10)
        while _done(events) is None:
            g.step()
        alone.append(_ids(events))

    g.admission.max_batch_tokens = 100  # each needs 50: two fit, the third waits
    streams = [_submit(engine, f"r{k}", p, 10) for k, p in enumerate(prompts)]
    g.step()
    assert len(g.active) == 2 and [r.request_id for r, _ in g.pending] == ["r2"]
    assert g.admission.waits == {"r2": Wait.BATCH_FULL}
    assert g.batch_tokens == 100
    most = 0
    while any(_done(s) is None for s in streams):
        g.step()
        most = max(most, g.batch_tokens)
        if _done(streams[0]) is None and _done(streams[1]) is None:
            assert g.pending, "admitted past the token budget"
    assert most <= 100
    for k, s in enumerate(streams):
        final = _done(s)
        assert final.finish_reason in (FinishReason.LENGTH, FinishReason.STOP), (k, final)
        assert _ids(s) == alone[k], f"request {k} ran differently after waiting"
