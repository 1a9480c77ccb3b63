"""The model loop without Ray: one thread owns the Generator, reached only through its inbox.

The same ModelLoop the model actor wraps, built here with an in-process cache
manager (LocalLink), so the thread, the inbox, the idle pool release and the
failure paths are exercised directly.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time

import numpy as np
import pytest

from engine.cache.manager import CacheManager
from engine.cache.messages import PlanRequest
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime import malloc
from engine.runtime.events import Finished, FinishReason, Tokens
from engine.runtime.generator import Generator
from engine.runtime.local import LocalLink
from engine.runtime.loop import ModelLoop
from engine.runtime.model.loader import load_model
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.runtime.tier.ram import RamTier
from engine.runtime.tier.stats import generator_stats


@pytest.fixture(scope="module")
def loaded(model_cache_dir, random_model_dir):
    # The random-weight qwen3_next: the loop's threading needs a model, not predictions.
    config = EngineConfig(
        model=ModelConfig(path=str(random_model_dir), prefill_step_size=128),
        cache=CacheConfig(cache_dir=str(model_cache_dir), ram_budget=1 << 30),
    )
    return config, load_model(config)


@pytest.fixture
def loop(loaded):
    config, (model, tokenizer, info) = loaded
    manager = CacheManager(config.cache, info.fingerprint, info.has_state_layers)

    def build() -> Generator:
        tier = RamTier(info.has_state_layers)
        return Generator(model, tokenizer, config, tier, LocalLink(manager))

    loop = ModelLoop(build, idle_release_s=0.5)
    loop.manager = manager
    yield loop
    loop.stop()


def submit(loop: ModelLoop, rid: str, tokens: list, max_tokens: int = 4) -> queue.SimpleQueue:
    """Plan and run on the loop thread; events arrive on the queue."""
    # planned on the loop thread, as the actor's commits reach the manager there
    request = PlanRequest(rid, np.asarray(tokens, np.int32))
    plan = loop.ask(lambda g: loop.manager.plan(request))
    req = GenerationRequest(
        rid, "", tuple(tokens), plan, SamplingParams(max_tokens=max_tokens), time.time()
    )
    events: queue.SimpleQueue = queue.SimpleQueue()
    loop.call(lambda g: g.submit(req, events.put))
    return events


def drain(events: queue.SimpleQueue, timeout: float = 60) -> tuple[list, Finished]:
    ids = []
    while True:
        event = events.get(timeout=timeout)
        if isinstance(event, Tokens):
            ids += event.ids
        elif isinstance(event, Finished):
            return ids, event


def test_requests_run_on_the_loop_thread_and_stream_back(loop):
    tokens = [(i * 13) % 3000 + 20 for i in range(300)]
    ids, final = drain(submit(loop, "a", tokens))
    assert final.finish_reason == FinishReason.LENGTH and len(ids) == 4
    again, warm = drain(submit(loop, "b", tokens + ids + [42, 43]))
    assert warm.cached_tokens > 0, "the second turn did not restore the first"
    stats = loop.ask(generator_stats)
    assert stats.entries >= 1 and stats.active == 0 and stats.ram_bytes > 0
    owner = loop.ask(lambda g: threading.current_thread().name)
    assert owner == "model-loop" and loop.thread.name == "model-loop"


def test_an_idle_loop_releases_the_pool_once(loop):
    drain(submit(loop, "c", [(i * 7) % 3000 + 20 for i in range(50)]))
    before = loop.pool_releases  # read within the 0.5 s of idleness that precede a release
    deadline = time.monotonic() + 10
    while loop.pool_releases == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.pool_releases == before + 1
    time.sleep(1.2)  # still idle: not released again
    assert loop.pool_releases == before + 1


@pytest.mark.skipif(malloc.glibc() is None, reason="malloc is not glibc's")
def test_an_idle_loop_gives_the_pages_its_burst_freed_back_to_the_system(loop):
    """16 MiB malloc'd on the loop thread and freed but for the last block (so no arena
    shrinks at its top by itself): the idle spell's trim returns most of it."""
    libc = malloc.glibc()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def burst(g) -> int:
        blocks = [libc.malloc(4000) for _ in range(4096)]
        for b in blocks[:-1]:
            ctypes.memset(b, 1, 4000)  # resident
        for b in blocks[:-1]:
            libc.free(b)
        return blocks[-1]

    # The fresh loop's first idle spell released already: no trim but the request's next
    # one can take the burst's pages (one coming as the burst ends would, before the read
    # of the counters below, on a loaded machine).
    deadline = time.monotonic() + 10
    while loop.malloc_trims == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    kept = loop.ask(burst)
    try:
        trims, returned = loop.malloc_trims, loop.malloc_returned
        drain(submit(loop, "d", [(i * 5) % 3000 + 20 for i in range(40)]))  # a new idle spell
        deadline = time.monotonic() + 10
        while loop.malloc_trims == trims and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loop.malloc_trims == trims + 1
        assert loop.malloc_returned - returned >= 8 << 20
    finally:
        loop.call(lambda g: libc.free(kept))


def test_a_failing_call_is_logged_and_the_loop_goes_on(loop, caplog):
    loop.call(lambda g: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        loop.ask(lambda g: 1 / 0)
    ids, final = drain(submit(loop, "d", [(i * 5) % 3000 + 20 for i in range(40)]))
    assert final.finish_reason == FinishReason.LENGTH and loop.alive
    assert "model loop call failed" in caplog.text


def test_a_failing_step_fails_the_batch_and_the_loop_serves_on(loop):
    def break_next_step(g):
        real = g.bg.next

        def broken():
            g.bg.next = real
            raise RuntimeError("boom")

        g.bg.next = broken

    events = submit(loop, "e", [(i * 3) % 3000 + 20 for i in range(40)])
    loop.call(break_next_step)
    _, failed = drain(events)
    assert failed.finish_reason == FinishReason.ERROR and "boom" in failed.error
    _, ok = drain(submit(loop, "f", [(i * 3) % 3000 + 21 for i in range(40)]))
    assert ok.finish_reason == FinishReason.LENGTH


def test_a_request_whose_cache_cannot_be_stored_ends_in_error_and_gives_its_plan_back(
    loop, monkeypatch
):
    from engine.runtime.tier import commits

    def broken(*args, **kwargs):
        raise RuntimeError("no room to store")

    monkeypatch.setattr(commits, "finished_entries", broken)
    ids, failed = drain(submit(loop, "g", [(i * 11) % 3000 + 20 for i in range(40)]))
    assert failed.finish_reason == FinishReason.ERROR and "no room to store" in failed.error
    assert len(ids) == 4  # its tokens streamed; only the storing failed
    assert loop.ask(lambda g: "g" not in loop.manager.flights)  # released, nothing staged
    monkeypatch.undo()
    _, ok = drain(submit(loop, "h", [(i * 11) % 3000 + 21 for i in range(40)]))
    assert ok.finish_reason == FinishReason.LENGTH


def test_a_failing_build_is_raised_by_the_constructor():
    def build():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        ModelLoop(build)
