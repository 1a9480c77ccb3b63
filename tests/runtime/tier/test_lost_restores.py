"""The model actor's side of restore ordering: it waits for the Orders a plan follows, and a
restore point found gone goes back to the manager for a new plan (real MLX, no Ray)."""

from __future__ import annotations

import numpy as np

from engine.cache.messages import PlanRequest
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.admission import Wait
from engine.runtime.events import Finished, Tokens
from engine.runtime.local import LocalEngine, LocalLink
from engine.runtime.requests import GenerationRequest, SamplingParams


class SlowLink(LocalLink):
    """A LocalLink whose commit Orders wait until `deliver()` (another path, another pace)."""

    def __init__(self, manager):
        super().__init__(manager)
        self.held = []
        self.slow = True

    def commit(self, commit, on_orders) -> None:
        orders = self.manager.commit(commit)
        if not self.slow:
            return on_orders(orders)
        self.held.append(lambda: on_orders(orders))

    def deliver(self) -> None:
        """Hand over what was held; from now on Orders come at once."""
        held, self.held, self.slow = self.held, [], False
        for fn in held:
            fn()


def make_engine(cache_dir, model_dir) -> LocalEngine:
    """On the random-weight qwen3_next (`random_model_dir`): replanning needs a hybrid
    model, not the trained one's predictions."""
    return LocalEngine(
        EngineConfig(
            model=ModelConfig(path=str(model_dir), prefill_step_size=128),
            cache=CacheConfig(cache_dir=str(cache_dir), ram_budget=1 << 30),
        )
    )


def submit(engine: LocalEngine, rid: str, tokens: list) -> list:
    plan = engine.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32)))
    events: list = []
    req = GenerationRequest(rid, "", tuple(tokens), plan, SamplingParams(max_tokens=3), 0.0, 0.0)
    engine.generator.submit(req, events.append)
    return events


def run(engine: LocalEngine, events: list) -> Finished:
    while not any(isinstance(e, Finished) for e in events):
        engine.generator.step()
    return next(e for e in events if isinstance(e, Finished))


def test_a_request_waits_for_the_orders_its_plan_follows(model_cache_dir, random_model_dir):
    engine = make_engine(model_cache_dir, random_model_dir)
    link = engine.generator.order_ledger.link = SlowLink(engine.manager)
    prompt = [(i * 31) % 3000 + 20 for i in range(300)]
    first = submit(engine, "r1", prompt)
    while not link.held:  # finished; its commit's Orders are on their way
        engine.generator.step()
    second = submit(engine, "r2", prompt + [7, 8, 9])
    plan = engine.generator.pending[0][0].plan
    assert plan.after_orders == 1 and engine.generator.order_ledger.applied == 0
    for _ in range(3):
        engine.generator.step()
    assert engine.generator.pending and not engine.generator.active, "restored too early"
    assert engine.generator.admission.waits == {"r2": Wait.ORDERS_BEHIND}
    link.deliver()
    assert run(engine, first).restore_kind == "none"
    final = run(engine, second)
    assert final.restore_kind == "reply" and not final.restore_lost
    assert engine.generator.order_ledger.applied == 2  # both commits


def test_a_restore_point_found_gone_is_replanned_logged_and_counted(
    model_cache_dir, random_model_dir
):
    engine = make_engine(model_cache_dir, random_model_dir)
    prompt = [(i * 37) % 3000 + 20 for i in range(300)]
    first = engine.run(prompt, max_tokens=3)
    entry = first.plan.new_entry_id
    del engine.tier.entries[entry]  # the model actor does not hold it after all
    second = engine.run(prompt + first.ids + [5, 6, 7], max_tokens=3)
    assert second.plan.entry_id == entry, "planned from the entry the actor lost"
    assert second.final.restore_lost == f"{entry}@{len(prompt) + 3}"
    assert second.final.restore_kind == "none", "no file to read it back from: cold"
    assert engine.manager.stats().restores_lost == 1
    assert entry not in engine.manager.index and not engine.generator.restorer.replanning
    third = engine.run(prompt + first.ids + [5, 6, 7] + second.ids + [1, 2], max_tokens=3)
    assert third.final.restore_kind == "entry" and not third.final.restore_lost


def test_a_verbatim_resend_prefills_nothing_and_decodes_the_same(model_cache_dir, random_model_dir):
    """The prompt end kept its log-probabilities: the first token is sampled from them."""
    engine = make_engine(model_cache_dir, random_model_dir)
    prompt = [(i * 41) % 3000 + 20 for i in range(700)]
    first = engine.run(prompt, max_tokens=6)
    prefilled = engine.generator.bg._counters.prompt_tokens
    resend = engine.run(prompt, max_tokens=6)
    assert (resend.plan.entry_id, resend.plan.length) == (first.plan.new_entry_id, len(prompt))
    assert resend.final.cached_tokens == len(prompt) and resend.final.restore_kind == "reply"
    assert engine.generator.bg._counters.prompt_tokens == prefilled, "a prompt token was run"
    assert resend.ids == first.ids, "the kept logits are the prompt end's"
    again = engine.run(prompt, max_tokens=1)  # done at its first token: nothing stored
    assert again.ids == first.ids[:1] and again.final.cached_tokens == len(prompt)
    following = engine.run(prompt + resend.ids + [9, 8, 7], max_tokens=3)
    assert following.final.cached_tokens == len(prompt) + len(resend.ids)


def test_the_guard_threshold_follows_the_measured_costs(model_cache_dir):
    from engine.runtime.model.loader import forward_costs, guard_threshold

    engine = LocalEngine(  # None: the threshold measured at load (what `serve` does)
        EngineConfig(cache=CacheConfig(cache_dir=str(model_cache_dir), guard_min_suffix=None))
    )
    forward_ms, token_ms = forward_costs(engine.model, chunk=32, repeats=1)
    assert forward_ms >= 0 and token_ms > 0
    assert guard_threshold(40.0, 0.5, 16) == 16 + 80  # an expensive forward: long suffixes
    assert guard_threshold(0.5, 0.5, 16) == 17  # a cheap chunk boundary: nearly always
    assert guard_threshold(1.0, 0.0, 16) == 4096
    assert engine.manager.config.guard_min_suffix == engine.info.guard_min_suffix


class SlowDisk:
    """A disk tier whose reads take `seconds` on the reader thread (entries kept in memory)."""

    def __init__(self, seconds: float):
        import threading

        self.entries, self.seconds, self.readers = {}, seconds, set()
        self._lock = threading.Lock()
        self._reader = None

    def start_read(self, entry_id):
        from concurrent.futures import ThreadPoolExecutor

        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="disk-reader")
        return self._reader.submit(self.read, entry_id)

    def read(self, entry_id):
        import threading
        import time

        with self._lock:
            self.readers.add(threading.current_thread().name)
        time.sleep(self.seconds)
        return self.entries.get(entry_id)

    def finish(self, read, namespace=None, tokens=None):
        return read

    def load(self, entry_id, namespace=None, tokens=None):
        return self.finish(self.read(entry_id))

    def write(self, entry, record):
        pass

    def delete(self, entry_id):
        pass


def test_a_disk_load_runs_on_the_reader_thread_while_others_decode(
    model_cache_dir, random_model_dir
):
    from dataclasses import replace

    engine = make_engine(model_cache_dir, random_model_dir)
    prompt = [(i * 43) % 3000 + 20 for i in range(300)]
    first = engine.run(prompt, max_tokens=3)
    entry = first.plan.new_entry_id
    disk = engine.tier.disk_tier = SlowDisk(0.5)
    disk.entries[entry] = engine.tier.entries.pop(entry)  # on disk only now
    decoding = submit(engine, "busy", [(i * 7) % 3000 + 20 for i in range(50)])
    decoding_req = engine.generator.pending[-1][0]
    engine.generator.pending[-1] = (
        replace(decoding_req, sampling=SamplingParams(40)),
        decoding.append,
    )
    while not any(isinstance(e, Tokens) for e in decoding):
        engine.generator.step()
    plan = engine.manager.plan(
        PlanRequest("loading", np.asarray(prompt + first.ids + [4, 5], np.int32))
    )
    assert plan.entry_id == entry
    loading: list = []
    req = GenerationRequest(
        "loading",
        "",
        tuple(prompt + first.ids + [4, 5]),
        replace(plan, load_from_disk=True),
        SamplingParams(max_tokens=2),
        0.0,
        0.0,
    )
    engine.generator.submit(req, loading.append)
    engine.generator.step()
    future = engine.tier._loads[entry].future
    tokens_before = sum(isinstance(e, Tokens) for e in decoding)
    while not future.done():
        engine.generator.step()
    during = sum(isinstance(e, Tokens) for e in decoding) - tokens_before
    assert during > 0, "decoding stopped while the file was read"
    assert disk.readers and all(n.startswith("disk-reader") for n in disk.readers)
    final = run(engine, loading)
    assert final.restore_kind != "none" and final.cached_tokens >= len(prompt)
    run(engine, decoding)
