"""The prefill worker's module-by-module evaluation, on real MLX modules.

`install_module_eval` wraps each module class's `__call__` once; the wrapper
evaluates a module's output only on a worker thread that asked for it
(engine.runtime.batching.prefill_worker), so the loop thread's forwards are untouched.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine.runtime.batching import prefill_worker
from engine.runtime.batching.prefill_worker import PrefillWorker, install_module_eval


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def __call__(self, x):
        return x + self.down(nn.relu(self.up(x)))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [Block(), Block()]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Batch:
    """What the worker runs: a batch whose `forward` runs the model (as LineagePromptBatch)."""

    def __init__(self, model):
        self.model, self.out = model, None

    def forward(self, prompts):
        self.out = self.model(prompts[0])
        mx.eval(self.out)


def evaluated() -> int:
    return sum(prefill_worker.EVALUATED.values())


def test_each_class_is_wrapped_once_and_inert_off_the_worker():
    model = Tiny()
    x = mx.ones((2, 8))
    expected = model(x)
    install_module_eval(model)  # (Linear may be wrapped already: by an engine of the session)
    assert all(getattr(c.__call__, "evaluating", False) for c in (Block, nn.Linear))
    assert not getattr(Tiny.__call__, "evaluating", False), "the logits would be evaluated"
    assert install_module_eval(model) == 0
    before = evaluated()
    assert mx.array_equal(model(x), expected)
    assert evaluated() == before, "the loop thread's forward evaluated module by module"


@pytest.mark.parametrize("module_eval", [True, False])
def test_the_worker_evaluates_each_module_only_when_asked(module_eval):
    model = Tiny()
    x = mx.random.normal((2, 8))
    expected = model(x)
    mx.eval(x, expected, model.parameters())  # a stream is its thread's: nothing left lazy
    worker = PrefillWorker(model, module_eval=module_eval)
    batch = Batch(model)
    before = dict(prefill_worker.EVALUATED)
    worker.start(batch, [x])
    worker.wait()
    worker.close()
    grew = {k: v - before.get(k, 0) for k, v in prefill_worker.EVALUATED.items()}
    grew = {k: v for k, v in grew.items() if v}
    if module_eval:  # 2 blocks, 4 linears; not the model itself (its logits)
        assert grew == {"Block": 2, "Linear": 4}
    else:
        assert grew == {}
    assert mx.allclose(batch.out, expected)


def test_module_eval_needs_the_model():
    with pytest.raises(ValueError, match="needs the model"):
        PrefillWorker(None, module_eval=True)
