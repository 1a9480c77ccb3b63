"""The training script's parts: host products and chunked recurrence against mlx-lm's own
arithmetic, the corpus sequences, and a short run's determinism.

Real MLX and numpy on small shapes; a few seconds in all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import gated_delta

from engine.runtime.speculative.mtp import lm_logits
from scripts import chunked_delta, host_ops
from scripts import train_tiny as tt

REPO = Path(__file__).resolve().parents[2]


def rel(a: mx.array, b: mx.array) -> float:
    return (mx.linalg.norm(a - b) / mx.linalg.norm(b)).item()


# ---------------------------------------------------------------- chunked gated delta


def delta_inputs(t: int, seed: int = 0):
    """Inputs of qwen3_next's recurrence: GQA (2 key heads, 4 value heads), unit keys."""
    mx.random.seed(seed)
    b, hk, hv, d = 2, 2, 4, 32
    q, k = (mx.random.normal((b, t, hk, d)) for _ in range(2))
    q, k = gated_delta.normalize_qk(q, k, inv_scale=d**-0.5, eps=1e-6)
    v = mx.random.normal((b, t, hv, d))
    a, beta_logit = mx.random.normal((b, t, hv)), 2 * mx.random.normal((b, t, hv))
    a_log, dt_bias = mx.log(mx.random.uniform(0, 16, (hv,))), mx.ones(hv)
    state = 0.1 * mx.random.normal((b, hv, d, d))
    return (q, k, v, a, beta_logit, a_log, dt_bias), state


@pytest.mark.parametrize("t", [1, 16, 37, 100])
def test_chunked_delta_equals_the_recurrence(t):
    args, state = delta_inputs(t)
    y_ref, s_ref = gated_delta.gated_delta_update(*args, state, use_kernel=False)
    y, s = chunked_delta.gated_delta_update(*args, state)
    assert y.shape == y_ref.shape and s.shape == s_ref.shape
    assert rel(y, y_ref) < 1e-5 and rel(s, s_ref) < 1e-5


def test_chunked_delta_gradients_equal_the_recurrence():
    args, state = delta_inputs(45)
    probe = mx.random.normal(args[2].shape)

    def loss(update):
        def f(*xs):
            y, s = update(*xs, state)
            return (y * probe).sum() + (s**2).sum()

        return f

    stock = lambda *xs: gated_delta.gated_delta_update(*xs, use_kernel=False)  # noqa: E731
    every = tuple(range(len(args)))
    grads_ref = mx.grad(loss(stock), argnums=every)(*args)
    grads = mx.grad(loss(chunked_delta.gated_delta_update), argnums=every)(*args)
    for name, g, g_ref in zip("q k v a b A_log dt_bias".split(), grads, grads_ref):
        assert rel(g, g_ref) < 1e-4, name


def test_chunked_delta_refuses_what_it_does_not_do():
    args, state = delta_inputs(8)
    with pytest.raises(ValueError, match="training only"):
        chunked_delta.gated_delta_update(*args, state, mask=mx.ones((2, 8), dtype=mx.bool_))


# ---------------------------------------------------------------- host products


def objective_stock(trainee, tokens):
    model = trainee.model
    hidden = model.model(tokens[:, :-1])
    main = nn.losses.cross_entropy(lm_logits(model, hidden), tokens[:, 1:]).mean()
    h2 = trainee.mtp(hidden[:, :-1], tokens[:, 1:-1], model.model.embed_tokens)
    return main + 0.3 * nn.losses.cross_entropy(lm_logits(model, h2), tokens[:, 2:]).mean()


def objective_training(trainee, tokens):
    main, mtp = tt.losses(trainee, tokens)
    return main + 0.3 * mtp


def test_training_paths_give_mlx_lm_s_loss_and_gradients():
    """Host products and the chunked recurrence installed: the same loss and gradients as
    mlx-lm's stock arithmetic, for every parameter of the model and the MTP head."""
    trainee = tt.build(0)
    trainee.train()
    tokens = mx.array(np.random.default_rng(0).integers(0, 4096, (2, 50)).astype(np.int32))
    loss_ref, grads_ref = nn.value_and_grad(trainee, objective_stock)(trainee, tokens)
    with host_ops.install(trainee), chunked_delta.install():
        attn = trainee.model.model.layers[1].self_attn
        assert type(attn.q_proj) is host_ops.HostLinear
        loss, grads = nn.value_and_grad(trainee, objective_training)(trainee, tokens)
    assert type(attn.q_proj) is nn.Linear  # put back
    assert abs(loss.item() - loss_ref.item()) < 1e-4
    grads, grads_ref = dict(tree_flatten(grads)), dict(tree_flatten(grads_ref))
    assert set(grads) == set(grads_ref)
    for name in grads:
        assert rel(grads[name], grads_ref[name]) < 1e-4, name


def test_host_attention_refuses_a_cache():
    q = mx.zeros((1, 4, 3, 8))
    with pytest.raises(ValueError, match="training only"):
        host_ops.host_attention(q, q, q, cache=object(), scale=1.0, mask="causal")


# ---------------------------------------------------------------- corpus


@pytest.fixture(scope="module")
def corpus():
    from scripts import tiny_corpus

    tokenizer = tiny_corpus.load_tokenizer()
    return tiny_corpus.load_corpus(tokenizer), tokenizer


def test_batches_are_seeded_and_exactly_sized(corpus):
    from scripts import tiny_corpus

    data, tokenizer = corpus
    mix = tuple((kind, 1.0) for kind in tiny_corpus.KINDS)

    def draw(seed):
        return tiny_corpus.batch(np.random.default_rng(seed), data, tokenizer, 12, 129, mix)

    a = draw(3)
    assert a.shape == (12, 129) and a.dtype == np.int32
    assert np.array_equal(a, draw(3)) and not np.array_equal(a, draw(4))


@pytest.mark.parametrize("kind", ["repeat", "noise", "noise64", "noise512"])
def test_repeats_repeat_and_noise_stays_in_its_ids(corpus, kind):
    from scripts import tiny_corpus

    data, tokenizer = corpus
    rng = np.random.default_rng(0)
    for _ in range(10):
        seq = tiny_corpus.sequence(rng, data, tokenizer, 200, ((kind, 1.0),))
        period = next(p for p in range(200 // 8, 200 // 2 + 1) if (seq[p:] == seq[:-p]).all())
        assert 200 // 8 <= period < 200 // 2
        if kind == "noise":
            assert seq.min() >= 3 and seq.max() < 4092
        elif kind != "repeat":
            assert set(seq) <= set(data.frequent[: int(kind[len("noise") :])])


def test_chat_copies_hold_the_snippet_twice(corpus):
    from scripts import tiny_corpus

    data, tokenizer = corpus
    rng = np.random.default_rng(0)
    ids = [tiny_corpus.chat_copy_ids(rng, data, tokenizer) for _ in range(20)]
    texts = [tokenizer.decode(i, skip_special_tokens=False) for i in ids]
    exact = 0
    for text in texts:
        user, reply = text.split("<|im_start|>assistant\n")
        assert reply.endswith("<|im_end|>\n")
        exact += reply[: -len("<|im_end|>\n")] in user
    assert 3 <= exact < 20  # some exact copies, some edited


def test_heldout_lines_are_not_trained_on(corpus):
    data, _ = corpus
    for train, heldout in zip(data.train_lines, data.heldout_lines):
        assert train and heldout
        assert len(heldout) < 0.1 * (len(train) + len(heldout)) + 1


# ---------------------------------------------------------------- determinism


def test_a_short_run_gives_the_same_bytes_in_two_processes(tmp_path):
    """The script's own entry point, twice, in fresh processes: identical weight files."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from threadpoolctl import threadpool_limits\n"
        "from scripts import train_tiny as tt, tiny_corpus\n"
        "tok = tiny_corpus.load_tokenizer()\n"
        "corpus = tiny_corpus.load_corpus(tok)\n"
        "mix = tuple((kind, 1) for kind in tiny_corpus.KINDS)\n"
        "phases = (tt.Phase(2, 2, 32, mix), tt.Phase(2, 2, 48, mix))\n"
        "plan = tt.Plan(phases=phases, warmup=1)\n"
        "with threadpool_limits(limits=1):\n"
        "    trainee, _ = tt.train(plan, corpus, tok, log=lambda line: None)\n"
        "tt.write(trainee, Path(sys.argv[1]), {})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Both at once (each single-threaded): two processes on the machine's two cores.
    outs = [tmp_path / run for run in ("a", "b")]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(out)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr
    for name in ("model.safetensors", "mtp.safetensors"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    untrained = tt.build(0).model.model.embed_tokens.weight
    trained = mx.load(str(outs[0] / "model.safetensors"))["model.embed_tokens.weight"]
    assert not mx.array_equal(trained, untrained).item()
