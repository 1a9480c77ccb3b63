"""The figures a client is told (engine.server.observe.figures), event by event; plain Python."""

from __future__ import annotations

from engine.cache.kinds import RestoreKind
from engine.runtime.events import Finished, FinishReason, Progress, Timing, Tokens
from engine.server.observe.figures import PROGRESS_EVERY_S, ClientFigures, rounded

TIMING = Timing(
    queue_ms=3.0,
    plan_ms=1.0,
    restore_ms=2.0,
    prefill_ms=40.0,
    commit_ms=5.0,
    ttft_ms=50.0,
    decode_tps=30.0,
    bytes_copied_restore=1000 * 331 + 70_000,
    bytes_copied_commit=70_000,
    restored_kv_bytes=1000 * 331,
    bytes_copied_batch=12_000,
)


def finished(n: int, kind=RestoreKind.DIVERGENCE) -> Finished:
    return Finished("r", FinishReason.STOP, 600, n, 1, kind, n, TIMING)


def test_a_final_event_keeps_the_block_alone():
    f = rounded(finished(331))
    assert (f.cached_tokens, f.restore_length, f.restore_kind) == (320, 320, "divergence")
    assert f.timing == Timing(ttft_ms=50.0, decode_tps=30.0, restored_kv_bytes=1000 * 320)
    assert rounded(finished(40)).restore_kind == RestoreKind.NONE  # less than a block
    assert rounded(finished(0)).timing.restored_kv_bytes == 0


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_progress_is_rounded_and_paced_by_the_clock():
    clock = Clock()
    figures = ClientFigures(exact=False, now=clock)
    assert figures.shown(Progress(300, 2000)) is None  # too soon after the start
    clock.t += PROGRESS_EVERY_S
    assert figures.shown(Progress(700, 2000)) == Progress(640, 2000)
    clock.t += PROGRESS_EVERY_S / 2
    assert figures.shown(Progress(900, 2000)) is None
    clock.t += PROGRESS_EVERY_S
    assert figures.shown(Progress(2000, 2000)) == Progress(2000, 2000)  # the end is whole
    assert figures.shown(Tokens((1,), "a")) == Tokens((1,), "a")


def test_exact_figures_pass_unchanged():
    figures = ClientFigures(exact=True)
    assert figures.shown(finished(331)) == finished(331)
    assert figures.shown(Progress(300, 2000)) == Progress(300, 2000)
