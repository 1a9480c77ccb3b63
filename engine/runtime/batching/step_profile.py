"""Where a step of the model loop spends its wall time: a bounded record of recent steps.

Each `Generator.step` is one record: its total wall time, split into phases
with exclusive time (a phase entered inside another pauses the outer one):

- `admit`: admission of pending requests (restores, batch insertion);
- `decode`: the generation batch's step (mlx-lm's: builds the next forward and
  evaluates the tokens of the one queued last step);
- `prefill`: the prefill forward of the step's chunk;
- `capture`: state snapshots and anchor extractions at capture points and at
  the prompt end;
- `commit`: storing a finished sequence's entry and telling the manager;
- `emit`: handing events to the stream (the Ray actor's queue, or a test's list);
- `other`: the rest (scheduling, moving sequences into the generation batch,
  the loop's own Python);
- `gc`: Python garbage collection inside the step (also counted in whichever
  phase it interrupted).

MLX evaluates lazily and mlx-lm queues the next decode forward asynchronously,
so a phase's time is where the loop waited, not always which computation ran:
a prefill forward first waits for the decode forward queued before it.

The steps are kept in a `Ring` (engine.runtime.batching.ring): its full size is
allocated at construction, so a long-lived loop's memory does not creep as it fills.

It knows a clock and the gc module; nothing about MLX, batches or requests.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass

from engine.runtime.batching.ring import Ring

PHASES = ("admit", "decode", "prefill", "capture", "commit", "emit", "other", "gc")
KEEP = 8192  # steps kept

# One kept step: StepRecord's fields, the phases' ms in PHASES' order.
STEP = [
    ("end", "f8"),
    ("total_ms", "f8"),
    ("phases", "f8", (len(PHASES),)),
    ("decoding", "i8"),
    ("prefill_tokens", "i8"),
    ("decoded", "?"),
]


@dataclass(frozen=True)
class StepRecord:
    """One step: when it ended (perf_counter s), its wall ms, ms per phase, what it ran."""

    end: float
    total_ms: float
    phases: dict
    decoding: int  # sequences in the generation batch after the step
    prefill_tokens: int  # prompt tokens its chunk prefilled
    decoded: bool = True  # its decode phase ran: a stream waited this step for its next token


class StepProfile:
    """Per-step wall time by phase, for the latest KEEP steps (module doc)."""

    def __init__(self, keep: int = KEEP):
        self.steps = Ring(STEP, keep)
        self.last: StepRecord | None = None  # the step ended last
        self._stack: list[list] = []  # [name, resumed at]
        self._ms: dict | None = None
        self._t0 = 0.0
        self._gc_t0: float | None = None
        self.prefill_tokens = 0
        self._decoded = False
        self._splits = False  # a decode phase was ever timed (not under `batched`)
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if self._ms is None:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self._ms["gc"] += (time.perf_counter() - self._gc_t0) * 1000
            self._gc_t0 = None

    def begin(self) -> None:
        self._ms = dict.fromkeys(PHASES, 0.0)
        self._decoded = False
        self._stack = []
        self.prefill_tokens = 0
        self._t0 = time.perf_counter()

    def end(self, decoding: int) -> StepRecord | None:
        if self._ms is None:
            return None
        now = time.perf_counter()
        total = (now - self._t0) * 1000
        ms = self._ms
        ms["other"] = max(0.0, total - sum(v for k, v in ms.items() if k not in ("other", "gc")))
        decoded = self._decoded if self._splits else decoding > 0  # batched: no decode phase
        tokens = self.prefill_tokens
        record = StepRecord(now, total, ms, decoding, tokens, decoded)
        self.steps.append((now, total, [ms[k] for k in PHASES], decoding, tokens, decoded))
        self.last = record
        self._ms = None
        return record

    @contextmanager
    def phase(self, name: str):
        """Time the block as `name` (exclusive of phases nested in it); no-op outside a step."""
        if self._ms is None:
            yield
            return
        now = time.perf_counter()
        if self._stack:
            outer = self._stack[-1]
            self._ms[outer[0]] += (now - outer[1]) * 1000
        self._stack.append([name, now])
        if name == "decode":
            self._decoded = self._splits = True
        try:
            yield
        finally:
            now = time.perf_counter()
            inner = self._stack.pop()
            if self._ms is not None:
                self._ms[inner[0]] += (now - inner[1]) * 1000
            if self._stack:
                self._stack[-1][1] = now

    def timed(self, name: str, fn):
        """`fn` wrapped so each call is timed as phase `name`."""

        def call(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)

        return call

    def summary(self, since: float = 0.0, until: float = float("inf")) -> dict:
        """Steps that decoded and ended in [since, until] (each a decoding stream's inter-token
        gap): percentiles of the wall time, the mean phase split of all of them and of the
        slowest 1% (what makes the p99 gaps)."""
        kept = self.steps.ordered()
        end = kept["end"]
        picked = kept[(since <= end) & (end <= until) & kept["decoded"] & (kept["decoding"] != 0)]
        if not len(picked):
            return {"steps": 0}
        # Python floats summed in the steps' order: the same figures as from records.
        totals_ = picked["total_ms"].tolist()
        phases = picked["phases"].tolist()
        prefill = picked["prefill_tokens"].tolist()
        n = len(totals_)
        totals = sorted(totals_)

        def pct(q: float) -> float:
            return totals[min(n - 1, int(q / 100 * n))]

        def split(group) -> dict:
            return {
                k: round(sum(phases[i][j] for i in group) / len(group), 3)
                for j, k in enumerate(PHASES)
            }

        worst = sorted(range(n), key=totals_.__getitem__)[-max(1, n // 100) :]  # stable
        return {
            "steps": n,
            "total_ms_p50": round(pct(50), 3),
            "total_ms_p99": round(pct(99), 3),
            "total_ms_max": round(totals[-1], 3),
            "prefill_tokens_mean": round(sum(prefill) / n, 2),
            "mean_ms": split(range(n)),
            "slowest_1pct_ms": split(worst),
            "slowest_1pct_prefill_tokens": round(sum(prefill[i] for i in worst) / len(worst), 2),
        }
