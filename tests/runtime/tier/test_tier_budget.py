"""The RAM tier within its budget while the manager's Orders are on their way (real MLX, no Ray).

A finished request's entry waits aside until the Orders answering its commit
come back, and enters the tier with them; a plan that loads a file waits for
the Orders that make room for it. So the tier never holds more than the
budget, at any step, however late the Orders come.
"""

from __future__ import annotations

import time

import numpy as np

from engine.cache.messages import PlanRequest
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.admission import Wait
from engine.runtime.events import Finished
from engine.runtime.local import LocalEngine, LocalLink
from engine.runtime.requests import GenerationRequest, SamplingParams

REPLY = 3


class HoldingLink(LocalLink):
    """A LocalLink whose commit and room Orders wait until `deliver()`."""

    def __init__(self, manager):
        super().__init__(manager)
        self.held = []

    def commit(self, commit, on_orders) -> None:
        orders = self.manager.commit(commit)
        self.held.append(lambda: on_orders(orders))

    def room(self, request_id, on_orders) -> None:
        orders = self.manager.room(request_id)
        self.held.append(lambda: on_orders(orders))

    def deliver(self) -> None:
        held, self.held = self.held, []
        for fn in held:
            fn()


def config(cache_dir, budget: int) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(prefill_step_size=128),
        cache=CacheConfig(cache_dir=str(cache_dir), ram_budget=budget, guard_min_suffix=10_000),
    )


def prompt(k: int, n: int = 300) -> list[int]:
    return [int(t) for t in np.random.default_rng(k).integers(20, 3000, n)]


class Stepper:
    """Steps an engine's generator, keeping the most its RAM tier held."""

    def __init__(self, engine: LocalEngine):
        self.engine, self.peak = engine, 0

    def submit(self, rid: str, tokens: list[int]) -> list:
        e = self.engine
        plan = e.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32)))
        events: list = []
        sampling = SamplingParams(max_tokens=REPLY)
        e.generator.submit(
            GenerationRequest(rid, "", tuple(tokens), plan, sampling, 0, 0), events.append
        )
        return events

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.engine.generator.step()
            self.peak = max(self.peak, self.engine.tier.nbytes)

    def until(self, done, limit: float = 60.0) -> None:
        end = time.monotonic() + limit
        while not done():
            assert time.monotonic() < end, "stuck"
            self.step()
            time.sleep(0.001)


def entry_size(model_cache_dir) -> tuple[int, tuple]:
    """The RAM bytes of one entry of a 300-token prompt and its reply, and the loaded model."""
    probe = LocalEngine(config(model_cache_dir, 1 << 30))
    probe.run(prompt(1), max_tokens=REPLY)
    return probe.tier.nbytes, (probe.model, probe.tokenizer, probe.info)


def indexed(engine: LocalEngine) -> int:
    """The bytes the manager counts: its index plus the frees a pin defers."""
    index = engine.manager.index
    return sum(e.nbytes for e in index.entries()) + index.deferred_bytes


def finished(events: list) -> bool:
    return any(isinstance(e, Finished) for e in events)


def test_a_finished_entry_enters_the_tier_with_its_commits_orders(model_cache_dir):
    size, loaded = entry_size(model_cache_dir)
    budget = size + size // 2  # one entry fits, two do not
    engine = LocalEngine(config(model_cache_dir, budget), loaded)
    link = engine.generator.order_ledger.link = HoldingLink(engine.manager)
    s = Stepper(engine)
    for k in (1, 2, 3):
        events = s.submit(f"r{k}", prompt(k))
        s.until(lambda: link.held)  # finished; its commit's Orders are on their way
        s.step(3)
        staged = engine.tier.staged_tokens
        assert staged >= 300 and engine.generator.batch_tokens == staged  # counted as batch
        assert engine.tier.nbytes <= budget and not finished(events)
        link.deliver()
        assert finished(events) and engine.tier.staged_tokens == 0
        assert len(engine.tier.entries) == 1, "the new entry came in, the old one went"
    assert s.peak <= engine.tier.peak <= budget, (s.peak, engine.tier.peak, budget)
    assert engine.tier.nbytes == sum(e.nbytes for e in engine.tier.entries.values()), (
        "the running total drifted"
    )
    assert engine.tier.nbytes == indexed(engine), "the tier holds what the index counts"
    assert engine.manager.stats().evictions == 2
    engine.manager.check_invariants()


def test_a_file_load_waits_for_the_orders_that_make_its_room(model_cache_dir, tmp_path):
    from engine.storage.directory import open_cache_directory
    from engine.storage.disk_store import open_disk_store

    size, loaded = entry_size(model_cache_dir)
    budget = size + size // 2
    cfg = config(tmp_path, budget)
    fingerprint = loaded[2].fingerprint
    opened = open_cache_directory(cfg.cache, fingerprint)
    store = open_disk_store(cfg, fingerprint)
    engine = LocalEngine(cfg, loaded, store, opened.index)
    try:
        first = engine.run(prompt(1), max_tokens=REPLY)
        engine.run(prompt(2), max_tokens=REPLY)  # evicts the first entry; its file stays
        assert store.flush(10)
        source = first.plan.new_entry_id
        assert source not in engine.tier.entries and source in engine.manager.disk_index
        link = engine.generator.order_ledger.link = HoldingLink(engine.manager)
        s = Stepper(engine)
        events = s.submit("r3", prompt(1) + first.ids + [5, 6, 7])
        plan = engine.generator.pending[0][0].plan
        assert (plan.entry_id, plan.load_from_disk) == (source, True)
        s.until(lambda: link.held)  # it asked for its room's Orders
        time.sleep(0.2)  # the file is read meanwhile
        s.step(5)
        assert engine.generator.pending and not engine.generator.active, "loaded before its room"
        assert engine.generator.admission.waits == {"r3": Wait.ROOM_ASKED}
        assert source not in engine.tier.entries
        link.deliver()  # the second entry's free: the file's entry comes in
        s.until(lambda: link.held)
        link.deliver()
        assert finished(events)
        final = next(e for e in events if isinstance(e, Finished))
        assert final.cached_tokens == 300 + len(first.ids), "restored from the file"
        assert s.peak <= engine.tier.peak <= budget, (s.peak, engine.tier.peak, budget)
        assert engine.tier.nbytes == sum(e.nbytes for e in engine.tier.entries.values()), (
            "the running total drifted"
        )
        assert engine.tier.nbytes == indexed(engine), "the tier holds what the index counts"
        engine.manager.check_invariants()
    finally:
        store.close(10)
        opened.close()
