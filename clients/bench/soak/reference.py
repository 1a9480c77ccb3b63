"""The machine's own speed through a soak: a fixed piece of work timed beside the traffic.

A soak's time to first token over an hour carries the machine's speed as well
as the engine's: on a shared or throttled machine the same forward can take a
third longer in one half hour than in the one before (a 60-minute soak's
prefill p50 went from 98 to 124-140 ms for the same prompts, in fresh
processes). `Reference` keeps a child process (`python -m
clients.bench.soak.reference`) that, asked by a line on its stdin, runs a fixed
piece of MLX work shaped like a small model's prefill (a few layers of
matmuls on a `TOKENS`-token block, on MLX's default device, as the engine's) `REPS`
times and answers the fastest, in milliseconds: the fastest leaves out the
moments the child waited for a core the serve held, so what is left is the
machine's speed, not the serve's load. A child of its own keeps the soak's
own threads (its users, its GIL) out of the figure.

The report sets the engine's TTFT drift beside the reference's drift over the
same stretches (clients.bench.soak.report.ttft_drift): the engine drifted
where its ratio over the reference's is past the bound. It knows nothing of
the serve.
"""

from __future__ import annotations

import select
import subprocess
import sys
import time

REPS = 5  # the fastest of this many
# a child that has not answered by then (its start included) is stalled: it is ended, and
# the sampler that asked goes on without it
ANSWER_S = 30.0
LAYERS, TOKENS, HIDDEN = 4, 64, 128


def _work(weights) -> float:
    """Milliseconds of one fixed forward through `weights`."""
    import mlx.core as mx

    t0 = time.perf_counter()
    x = mx.ones((TOKENS, HIDDEN)) / HIDDEN
    for up, down in weights:
        x = x + mx.maximum(x @ up, 0) @ down
    mx.eval(x)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    import mlx.core as mx

    weights = [
        (
            mx.random.normal((HIDDEN, 4 * HIDDEN), key=mx.random.key(2 * k)) / HIDDEN,
            mx.random.normal((4 * HIDDEN, HIDDEN), key=mx.random.key(2 * k + 1)) / HIDDEN,
        )
        for k in range(LAYERS)
    ]
    mx.eval(weights)
    _work(weights)  # the first run compiles and pages in
    for _ in sys.stdin:
        print(f"{min(_work(weights) for _ in range(REPS)):.3f}", flush=True)


class Reference:
    """The child that times the fixed work; `time()` asks it once (None once it is gone,
    or it did not answer within `ANSWER_S`: then it is ended)."""

    def __init__(self, command=(sys.executable, "-m", "clients.bench.soak.reference")):
        self.process = subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def time(self) -> float | None:
        try:
            self.process.stdin.write("\n")
            self.process.stdin.flush()
            if not select.select([self.process.stdout], [], [], ANSWER_S)[0]:
                self.process.kill()  # a stalled child would hold the sampler for good
                self.process.wait()
                return None
            line = self.process.stdout.readline()
            return float(line) if line else None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


if __name__ == "__main__":
    main()
