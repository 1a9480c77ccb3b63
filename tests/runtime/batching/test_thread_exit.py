"""A thread that ran MLX work ends without aborting the process at exit.

MLX keeps per-thread state (its streams, its cache of `mx.compile`d
functions, which holds Python objects) and drops it in the thread's C++ exit
handlers, which take the GIL. A prefill worker closed just before the process
exits ended while the interpreter finalized: Python stopped it inside that
handler and the process aborted ("terminate called without an active
exception", `lineage bench speculative`). `release_thread` drops the state
while the interpreter is whole; a closed worker runs it on its own thread.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import pytest

from engine.kernels import cpu_streams
from engine.runtime.batching import prefill_worker
from engine.runtime.batching.prefill_worker import PrefillWorker

ROOT = Path(__file__).resolve().parents[3]

# Workers that run compiled MLX work, closed as the process exits (the bench's end).
EXIT_SCRIPT = """
import mlx.core as mx
from engine.runtime.batching.prefill_worker import PrefillWorker

@mx.compile
def step(x):
    return mx.tanh(x @ x) * 2 + 1

class Batch:
    def forward(self, prompts):
        b = mx.random.normal((256, 256))
        for _ in range(4):
            b = step(b)
        mx.eval(b)

workers = [PrefillWorker() for _ in range(4)]
for w in workers:
    w.start(Batch(), [])
for w in workers:
    w.wait()
    w.close()
"""


def test_workers_closed_as_the_process_exits_do_not_abort_it():
    # Without the release, 28 of 40 such processes aborted (3 workers each): 4 in a row
    # passing by chance would be 0.8%.
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT], cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0 and "terminate called" not in done.stderr, done.stderr


def test_a_closed_worker_releases_its_thread_once_on_that_thread(monkeypatch):
    ran = []
    monkeypatch.setattr(
        prefill_worker, "release_thread", lambda: ran.append(threading.current_thread().name)
    )
    worker = PrefillWorker()
    worker.close()
    worker.close(wait=False)  # a second close (the collector's) submits nothing
    assert len(ran) == 1 and ran[0].startswith("prefill-worker"), ran


def test_release_thread_drops_the_threads_streams_and_new_ones_work():
    if cpu_streams.streams() == [None]:
        pytest.skip("one stream (off the CPU, or one core): nothing of a thread's own")
    seen = {}

    def work():
        old = cpu_streams.streams()[0]
        with cpu_streams.on(old):
            mx.eval(mx.ones((4,)) * 2)
        cpu_streams.release_thread()
        with pytest.raises(RuntimeError, match="no Stream"):  # gone with the thread's state
            with cpu_streams.on(old):
                mx.eval(mx.ones((4,)) * 3)
        new = cpu_streams.streams()[0]
        with cpu_streams.on(new):
            seen["value"] = (mx.ones((2,)) * 5).tolist()

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert seen.get("value") == [5.0, 5.0]
