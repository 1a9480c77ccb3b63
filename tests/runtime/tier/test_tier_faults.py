"""The RAM tier under faults (real MLX, real files, no Ray).

- A file read whose request is cancelled while it waits is let go: nothing is
  left in the tier's table (nor its buffers outside the budget).
- A failed read is never handed to a later plan of the same id: once the file
  is sound again, the next plan loads it, and nothing is counted damaged.
- An entry id that names rows computed on other tokens (what a manager that
  reused an id would cause) is refused at restore: counted, logged, and the
  request is served as a cold prefill would serve it, never another prompt's
  continuation. On a model without state layers too, where any length restores.
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from engine.cache.messages import PlanRequest
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.events import Finished, FinishReason
from engine.runtime.local import LocalEngine, LocalLink
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.storage import file_format

REPLY = 3


def config(cache_dir, budget: int = 1 << 30, model: str | None = None) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(prefill_step_size=128, path=model),
        cache=CacheConfig(cache_dir=str(cache_dir), ram_budget=budget, guard_min_suffix=10_000),
    )


def prompt(k: int, n: int = 300) -> list[int]:
    return [int(t) for t in np.random.default_rng(k).integers(20, 3000, n)]


class DiskEngine:
    """A LocalEngine with the disk tier on, in a directory of its own; `restart` is a new
    process on the same directory (an empty RAM tier, the files indexed from the scan)."""

    def __init__(self, cache_dir, model_cache_dir, loaded=None):
        self.cfg = config(cache_dir)
        self.loaded = loaded
        self.opened = self.store = None
        self.start()

    def start(self) -> None:
        from engine.storage.directory import open_cache_directory
        from engine.storage.disk_store import open_disk_store

        if self.loaded is None:
            self.engine = LocalEngine(self.cfg)
            self.loaded = (self.engine.model, self.engine.tokenizer, self.engine.info)
        fingerprint = self.loaded[2].fingerprint
        self.opened = open_cache_directory(self.cfg.cache, fingerprint)
        self.store = open_disk_store(self.cfg, fingerprint)
        self.engine = LocalEngine(self.cfg, self.loaded, self.store, self.opened.index)

    def restart(self) -> None:
        self.close()
        self.start()

    def close(self) -> None:
        self.store.close(10)
        self.opened.close()

    def submit(self, rid: str, tokens: list[int]) -> list:
        e = self.engine
        plan = e.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32)))
        events: list = []
        req = GenerationRequest(rid, "", tuple(tokens), plan, SamplingParams(REPLY), 0.0, 0.0)
        e.generator.submit(req, events.append)
        return events

    def until(self, done, limit: float = 60.0) -> None:
        end = time.monotonic() + limit
        while not done():
            assert time.monotonic() < end, "stuck"
            self.engine.generator.step()
            time.sleep(0.001)


class RoomHeld(LocalLink):
    """A LocalLink that holds the answers to `room` (the request waits for them, its file's
    read under way), so a test decides when the request may start."""

    def __init__(self, manager):
        super().__init__(manager)
        self.held = []

    def room(self, request_id, on_orders) -> None:
        orders = self.manager.room(request_id)
        self.held.append(lambda: on_orders(orders))


def final(events: list) -> Finished | None:
    return next((e for e in events if isinstance(e, Finished)), None)


@pytest.fixture
def disk(tmp_path, model_cache_dir):
    d = DiskEngine(tmp_path / "cache", model_cache_dir)
    yield d
    d.close()


def _on_disk_only(disk: DiskEngine) -> tuple[int, list[int]]:
    """A first turn whose entry is on disk only (a restart); (its id, the next prompt)."""
    first = disk.engine.run(prompt(1), max_tokens=REPLY)
    assert disk.store.flush(10)
    disk.restart()
    entry = first.plan.new_entry_id
    assert entry in disk.engine.manager.disk_index and not disk.engine.tier.entries
    disk.engine.generator.order_ledger.link = RoomHeld(disk.engine.manager)
    return entry, prompt(1) + first.ids + [5, 6, 7]


def test_a_read_whose_request_is_cancelled_leaves_nothing_behind(disk):
    entry, follow_up = _on_disk_only(disk)
    events = disk.submit("r1", follow_up)
    disk.engine.generator.step()  # its file's read starts; it waits for its room's Orders
    assert disk.engine.tier.loads == 1
    disk.engine.generator.cancel("r1")
    assert final(events).finish_reason == FinishReason.CANCELLED
    assert disk.engine.tier.loads == 0, "a read nobody waits for is still held"
    assert entry not in disk.engine.tier.entries


def test_a_failed_read_is_not_replayed_for_a_later_plan(disk):
    entry, follow_up = _on_disk_only(disk)
    path = file_format.entry_path(disk.store.directory, entry)
    aside = path.with_name("aside")
    shutil.move(path, aside)  # the read fails (as one racing a write elsewhere would)
    events = disk.submit("r1", follow_up)
    disk.engine.generator.step()  # its file's read starts; it waits for its room's Orders
    read = disk.engine.tier._loads[entry].future
    disk.until(read.done)
    disk.engine.generator.cancel("r1")
    assert final(events).finish_reason == FinishReason.CANCELLED
    shutil.move(aside, path)  # sound again
    held = disk.engine.generator.order_ledger.link
    for answer in held.held:  # r1's room: its Orders still apply
        answer()
    disk.engine.generator.order_ledger.link = LocalLink(disk.engine.manager)
    events = disk.submit("r2", follow_up)
    disk.until(lambda: final(events) is not None)
    done = final(events)
    assert done.restore_kind != "none" and not done.restore_lost, done
    assert done.cached_tokens >= len(follow_up) - 3
    stats = disk.engine.manager.stats()
    assert (stats.damaged_files, stats.restores_lost) == (0, 0)
    assert disk.engine.tier.loads == 0


@pytest.fixture(scope="module")
def attention_only(tmp_path_factory) -> str:
    from engine.runtime.model.tiny_models import write_model_dir

    return str(write_model_dir("llama", tmp_path_factory.mktemp("llama")))


@pytest.mark.parametrize("arch", ["hybrid", "attention-only"])
def test_rows_of_other_tokens_under_a_plans_id_are_refused(model_cache_dir, arch, request):
    model = request.getfixturevalue("attention_only") if arch == "attention-only" else None
    engine = LocalEngine(config(model_cache_dir, model=model))
    a = engine.run(prompt(1), max_tokens=REPLY)
    b = engine.run(prompt(2), max_tokens=REPLY)
    x, y = a.plan.new_entry_id, b.plan.new_entry_id
    # The id confusion: x's id now names b's rows (a restarted manager reusing an id).
    engine.tier.entries[x] = engine.tier.entries[y]
    follow_up = prompt(1) + a.ids + [5, 6, 7]
    warm = engine.run(follow_up, max_tokens=8)
    assert warm.plan.entry_id == x and warm.plan.length > 0
    assert warm.final.restore_lost == f"{x}@{warm.plan.length}", warm.final
    assert engine.tier.token_mismatches == 1
    assert engine.manager.stats().restores_lost == 1
    cold = LocalEngine(
        config(model_cache_dir, model=model), (engine.model, engine.tokenizer, engine.info)
    )
    assert warm.ids == cold.run(follow_up, max_tokens=8, cold=True).ids, "another prompt's reply"
