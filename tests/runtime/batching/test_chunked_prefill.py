"""Chunked prefill under the scheduler, on the real tiny model, without Ray.

The Generator is stepped on the calling thread (as LocalEngine does), so each
test sees what one step did: every decoding stream decodes each step, a long
prefill runs in budget-sized chunks, a cancelled prefill commits what it
computed up to the chunk boundary, an anchor waiter starts in the step after
the capture, and every schedule gives the tokens `batched` gives, with the
chunk's forward on the prefill worker thread (`--prefill-overlap on`) and
without.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine.cache.messages import PlanRequest
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.admission import Wait
from engine.runtime.batching import prefill_worker
from engine.runtime.batching.batch import LineagePromptBatch
from engine.runtime.events import Finished, FinishReason, Progress, Tokens
from engine.runtime.local import LocalEngine
from engine.runtime.model.loader import load_model
from engine.runtime.requests import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def loaded(model_cache_dir, random_model_dir):
    # The random-weight qwen3_next: schedules are compared with each other, not with the
    # trained model's predictions, and its prefill is the faster one on a CPU.
    config = EngineConfig(
        model=ModelConfig(path=str(random_model_dir)),
        cache=CacheConfig(cache_dir=str(model_cache_dir), ram_budget=1 << 30),
    )
    return config, load_model(config)


def engine(
    loaded,
    schedule="srpt",
    budget=64,
    group=1,
    overlap=False,
    prefill_eval="auto",
    step_factor=ModelConfig.prefill_step_factor,
    slice_ms=ModelConfig.prefill_slice_ms,
    wait_bound=ModelConfig.prefill_wait_bound,
) -> LocalEngine:
    config, model = loaded
    model_config = ModelConfig(
        prefill_step_size=256,
        prefill_step_factor=step_factor,
        prefill_slice_ms=slice_ms,
        schedule=schedule,
        prefill_budget=budget,
        prefill_group=group,
        prefill_overlap=overlap,
        prefill_eval=prefill_eval,
        prefill_wait_bound=wait_bound,
    )
    return LocalEngine(EngineConfig(model=model_config, cache=config.cache), model)


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(20, 4000, n).tolist()


def submit(eng, rid, prompt, max_tokens=4, anchor_len=0, namespace="") -> list:
    plan = eng.manager.plan(PlanRequest(rid, np.asarray(prompt, np.int32), anchor_len, namespace))
    events: list = []
    sampling = SamplingParams(max_tokens=max_tokens)
    request = GenerationRequest(rid, namespace, tuple(prompt), plan, sampling, time.time())
    eng.generator.submit(request, events.append)
    return events


def ids(events) -> list[int]:
    return [i for e in events if isinstance(e, Tokens) for i in e.ids]


def final(events) -> Finished | None:
    return next((e for e in events if isinstance(e, Finished)), None)


def run_all(eng) -> None:
    while eng.generator.busy:
        eng.generator.step()


def test_streams_decode_every_step_while_a_long_prompt_prefills_in_chunks(loaded):
    eng = engine(loaded, budget=32)
    a = submit(eng, "a", tokens(40, 1), max_tokens=200)
    while not ids(a):
        eng.generator.step()
    b = submit(eng, "b", tokens(1500, 2), namespace="b")
    bg = eng.generator.bg
    while not ids(b) and final(a) is None:
        before = len(ids(a))
        eng.generator.step()
        decoded = len(ids(a)) == before + 1 or final(a) is not None  # or it sampled EOS
        assert decoded, "a decoding stream skipped a step"
    uid = eng.generator.by_request["b"]
    assert sum(uid in c.uids for c in bg.chunks) >= 20, "the long prompt was not chunked"
    assert max(c.tokens * len(c.uids) for c in eng.generator.bg.chunks) <= 32
    run_all(eng)
    assert any(isinstance(e, Progress) for e in b), "no prefill progress"


def test_a_short_prefill_runs_whole_beside_decode_when_it_fits_the_streams_gaps(loaded):
    # A gap budget of 1000 idle decode steps holds it (whether one is cut to a smaller budget
    # is the policy's, tests/runtime/batching/test_prefill_growth.py, on injected costs).
    eng = engine(loaded, budget=256, step_factor=1000.0)
    a = submit(eng, "a", tokens(40, 1), max_tokens=300)
    while len(ids(a)) < 8:  # the decode-only step is measured
        eng.generator.step()
    b = submit(eng, "b", tokens(240, 5), namespace="b")
    steps = 0
    while not ids(b):
        before = len(ids(a))
        eng.generator.step()
        assert len(ids(a)) == before + 1 or final(a) is not None, "the stream skipped a step"
        steps += 1
    uid = eng.generator.by_request["b"]
    chunks = [c for c in eng.generator.bg.chunks if uid in c.uids]
    # one chunk per segment (a capture point may split it), then its first token
    assert sum(c.tokens for c in chunks) == 239
    assert steps <= 3 and len(chunks) <= 2 and all(c.whole for c in chunks), chunks
    run_all(eng)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_cancelled_prefill_commits_up_to_its_chunk_boundary(loaded, overlap):
    eng = engine(loaded, budget=64, overlap=overlap)
    prompt = tokens(1200, 3)
    events = submit(eng, "c", prompt, namespace="c")
    for _ in range(5):
        eng.generator.step()
    uid = eng.generator.by_request["c"]
    eng.generator.cancel("c")  # a chunk in flight ends first, and counts
    done = sum(c.tokens for c in eng.generator.bg.chunks if uid in c.uids)
    assert 0 < done < len(prompt)  # chunk sizes follow the measured time
    assert final(events).finish_reason == FinishReason.CANCELLED
    retry = submit(eng, "c2", prompt, namespace="c")
    run_all(eng)
    assert final(retry).cached_tokens == done, "the prefix computed before the cancel was lost"


@pytest.mark.parametrize("overlap", [False, True])
def test_an_anchor_waiter_starts_in_the_step_after_the_capture(loaded, overlap):
    eng = engine(loaded, budget=64, overlap=overlap)
    system = tokens(600, 4)
    first = submit(eng, "s1", system + tokens(40, 5), anchor_len=600, namespace="s")
    eng.generator.step()
    waiter = submit(eng, "s2", system + tokens(30, 6), anchor_len=600, namespace="s")
    plan = eng.generator.pending[-1][0].plan
    assert plan.wait, "the second request does not wait on the anchor"
    while not eng.tier.can_restore(plan.entry_id, plan.length):
        assert "s2" not in eng.generator.by_request
        eng.generator.step()
        assert eng.generator.admission.waits["s2"] == Wait.ANCHOR_CAPTURE
    eng.generator.step()
    assert "s2" in eng.generator.by_request, "the waiter did not start right after the capture"
    run_all(eng)
    assert final(waiter).cached_tokens == plan.length and final(first).cached_tokens == 0


def workload(eng) -> dict:
    """Warm conversations, then warm turns of different sizes and a cold prompt at once."""
    out = {}
    bases = {k: tokens(300 + 100 * k, 10 + k) for k in range(3)}
    for k, base in bases.items():
        out[f"base{k}"] = submit(eng, f"base{k}", base, max_tokens=3, namespace=f"w{k}")
        run_all(eng)
    turns = {
        "cold": (tokens(900, 20), "cold"),
        "warm0": (bases[0] + ids(out["base0"]) + tokens(200, 21), "w0"),
        "warm1": (bases[1] + ids(out["base1"]) + tokens(20, 22), "w1"),
        "warm2": (bases[2] + ids(out["base2"]) + tokens(230, 23), "w2"),
    }
    for rid, (prompt, namespace) in turns.items():
        out[rid] = submit(eng, rid, prompt, max_tokens=8, namespace=namespace)
    run_all(eng)
    return {rid: ids(events) for rid, events in out.items()}


@pytest.mark.parametrize("overlap", [False, True])
def test_every_schedule_gives_the_tokens_batched_gives(loaded, overlap):
    expected = workload(engine(loaded, schedule="batched"))
    for schedule, group in (("srpt", 1), ("fifo", 1), ("srpt", 3)):
        eng = engine(loaded, schedule=schedule, group=group, overlap=overlap)
        assert workload(eng) == expected, f"{schedule} (group {group}) differs from batched"
    # Whether a cohort forms under the wait bound depends on the costs measured as it runs
    # (a prompt the bound presses runs alone), so the grouped run the assertion reads has
    # the bound off: the cohort then depends on the workload alone.
    eng = engine(loaded, schedule="srpt", group=3, overlap=overlap, wait_bound=0)
    assert workload(eng) == expected, "srpt (group 3, no wait bound) differs from batched"
    assert any(len(c.uids) > 1 for c in eng.generator.bg.chunks), "no cohort was grouped"


def test_with_overlap_streams_decode_while_a_chunk_runs_on_the_worker(loaded, monkeypatch):
    """The chunk's forward runs on the worker thread while steps decode (on the loop's when
    nothing decodes); same tokens."""
    prompt = tokens(1500, 2)
    serial = engine(loaded, budget=64)
    expected = submit(serial, "b", prompt, namespace="b")
    run_all(serial)
    threads = set()
    forward = LineagePromptBatch.forward

    def recorded(batch, prompts):
        threads.add(threading.current_thread().name)
        return forward(batch, prompts)

    monkeypatch.setattr(LineagePromptBatch, "forward", recorded)
    eng = engine(loaded, budget=64, overlap=True)
    bg = eng.generator.bg
    a = submit(eng, "a", tokens(40, 1), max_tokens=400)
    while not ids(a):
        eng.generator.step()
    assert threads == {threading.current_thread().name}  # nothing decoded: inline
    threads.clear()
    b = submit(eng, "b", prompt, namespace="b")
    beside = 0  # steps that decoded while a chunk was in flight
    decoding = set()  # threads of the forwards in steps that `a` decoded through
    while not ids(b) and final(a) is None:
        before = len(ids(a))
        in_flight = bg.flight is not None
        threads.clear()
        eng.generator.step()
        beside += in_flight and len(ids(a)) == before + 1
        if final(a) is None:  # the step `a` ends in has nothing left to decode: inline
            decoding |= threads
    assert beside > 0, "no step decoded beside a chunk in flight"
    assert decoding and all(n.startswith("prefill-worker") for n in decoding), decoding
    threads.clear()
    run_all(eng)
    assert ids(b) == ids(expected), "the overlapped prefill gave other tokens"
    bg.close()


def test_beside_decode_two_long_prompts_do_not_take_turns(loaded):
    """With the chunks on the worker many decode steps pass during one; a waiting prompt ages
    by the chunks picked, not by those steps, so of two long prompts of one length the first
    prefills to its end before the other starts (each ends as early as it can) instead of
    taking turns chunk by chunk. (Aged by the steps, the waiting one won after one chunk.)"""
    eng = engine(loaded, budget=64, overlap=True, slice_ms=1000.0)  # chunks of the budget
    bg = eng.generator.bg
    streams = [submit(eng, f"s{k}", tokens(40, 10 + k), max_tokens=2000) for k in range(3)]
    while not all(ids(s) for s in streams):
        eng.generator.step()
    a = submit(eng, "a", tokens(700, 7), namespace="a")
    b = submit(eng, "b", tokens(700, 8), namespace="b")
    uids = {}
    while not (ids(a) and ids(b)):
        eng.generator.step()
        for rid in ("a", "b"):
            uids.setdefault(rid, eng.generator.by_request.get(rid))
    order = [c.uids[0] for c in bg.chunks if c.uids[0] in uids.values()]
    assert any(final(s) is None for s in streams), "the streams ended before both prompts"
    assert order == sorted(order, key=lambda u: u != order[0]), order  # one, then the other
    run_all(eng)
    bg.close()


@pytest.mark.parametrize("prefill_eval", ["auto", "forward"])
def test_on_the_cpu_the_worker_evaluates_module_by_module(loaded, prefill_eval):
    """`--prefill-eval auto` on the CPU: the chunks on the worker longer than the streams' gap
    budget (background work) evaluate each module's output (its MLX queue stays short beside
    decode); the loop's inline chunks, those within the budget and a short prefill run whole
    do not; `forward` evaluates whole forwards. Same tokens either way. The chunks evaluated
    module by module have a cost fit of their own."""
    prompt = tokens(1200, 3)
    serial = engine(loaded, budget=64)
    expected = submit(serial, "b", prompt, namespace="b")
    run_all(serial)
    # A slice of 0.5 ms: no chunk fits the streams' gaps, every one beside them is background.
    eng = engine(loaded, budget=64, overlap=True, prefill_eval=prefill_eval, slice_ms=0.5)
    bg = eng.generator.bg
    assert bg.worker.module_eval == (prefill_eval == "auto")
    counted = lambda: sum(prefill_worker.EVALUATED.values())  # noqa: E731
    start = counted()
    inline = submit(eng, "i", tokens(600, 4), namespace="i")  # alone: its chunks run inline
    run_all(eng)
    assert counted() == start, "a chunk on the loop thread evaluated module by module"
    a = submit(eng, "a", tokens(40, 1), max_tokens=300)
    while not ids(a):
        eng.generator.step()
    b = submit(eng, "b", prompt, namespace="b")
    on_worker, uid = 0, None
    while not ids(b):  # (once `a` ends, b's last chunks run inline)
        on_worker += bg.flight is not None
        eng.generator.step()
        uid = eng.generator.by_request.get("b", uid)
    assert on_worker > 0, "no chunk ran on the worker"
    assert any(c.background for c in bg.chunks if uid in c.uids), "no chunk was background"
    grew = counted() - start
    assert grew > 0 if prefill_eval == "auto" else grew == 0, grew
    # Their costs are fitted apart from the chunks evaluated whole (another fixed cost),
    # and the scheduler is told the background chunks' fixed cost only where they differ.
    whole_chunks = bg.chunk_costs.count
    assert whole_chunks > 0  # the inline ones
    assert bg.module_costs.count > 0 if prefill_eval == "auto" else bg.module_costs.count == 0
    told = bg._costs().background_fixed_ms
    assert told is not None if prefill_eval == "auto" else told is None
    c = submit(eng, "c", tokens(40, 6), max_tokens=100, namespace="c")  # decodes beside it
    while not ids(c):
        eng.generator.step()
    short = submit(eng, "s", tokens(50, 5), namespace="s")  # within the budget
    before, on_worker = counted(), 0
    while not ids(short):
        on_worker += bg.flight is not None
        eng.generator.step()
    assert on_worker > 0, "the short prefill did not run on the worker"
    uid = eng.generator.by_request["s"]
    background = any(c.background for c in bg.chunks if uid in c.uids)
    by_module = prefill_eval == "auto" and background
    assert (counted() > before) == by_module, "a chunk within the gaps went module by module"
    run_all(eng)
    assert ids(b) == ids(expected) and ids(inline) and ids(short)
    bg.close()


def test_the_chunk_sizing_settings_reach_the_scheduler(loaded):
    """--prefill-step-factor and --prefill-slice-ms are the scheduler's, not constants."""
    config, model = loaded
    m = ModelConfig(prefill_step_factor=1.75, prefill_slice_ms=20.0)
    scheduler = LocalEngine(EngineConfig(model=m, cache=config.cache), model).generator.bg.scheduler
    assert (scheduler.step_factor, scheduler.slice_ms) == (1.75, 20.0)


def _worker_up_then_idle(eng):
    """Step `eng` until a prefill chunk ran on the worker (its thread is up), then to the
    end of every request; the batch generator."""
    bg = eng.generator.bg
    while bg.worker._pool._threads == set():
        eng.generator.step()
    run_all(eng)
    return bg


def test_collecting_a_generator_never_waits_for_its_worker_thread(loaded):
    """mlx-lm's BatchGenerator.__del__ closes it, and the collector may run that on a thread
    that is starting and holds threading's shutdown lock, which the prefill worker's thread
    needs to end: a close that joined the worker there deadlocked the suite once. The
    finalizer returns with the lock held; the worker ends once it is free."""
    eng = engine(loaded, budget=64, overlap=True)
    a = submit(eng, "a", tokens(40, 1), max_tokens=200)
    while not ids(a):
        eng.generator.step()
    submit(eng, "b", tokens(1500, 2), namespace="b")
    bg = _worker_up_then_idle(eng)
    finalized = threading.Event()

    def collect():
        bg.__del__()
        finalized.set()

    with threading._shutdown_locks_lock:  # as a starting thread holds it (Thread._bootstrap)
        t = threading.Thread(target=collect, daemon=True)
        t.start()
        assert finalized.wait(10), "the finalizer waited for the worker's thread"
    t.join(10)


def test_a_finalizer_inside_another_executors_submit_returns(loaded):
    """The collector may run the generator's finalizer inside another executor's `submit`
    (the disk tier's read pool starting a thread), which holds concurrent.futures' global
    shutdown lock: a finalizer that submitted the worker's last task there deadlocked one
    thread with itself. It submits nothing, and returns."""
    from concurrent.futures import thread as futures_thread

    eng = engine(loaded, budget=64, overlap=True)
    submit(eng, "b", tokens(600, 2))
    bg = _worker_up_then_idle(eng)
    finalized = threading.Event()

    def collect():
        with futures_thread._global_shutdown_lock:  # as ThreadPoolExecutor.submit holds it
            bg.__del__()
        finalized.set()

    t = threading.Thread(target=collect, daemon=True)
    t.start()
    assert finalized.wait(10), "the finalizer submitted under the executor's lock"
    t.join(10)
