"""The embedded default model: shipped trained weights, its MTP head, what it has learned.

Real MLX on the shipped weights. The figures are checked against bounds well inside
what docs/model.md reports, on the corpus' held-out part (CPython 3.11's own files:
those tests skip on another Python).
"""

from __future__ import annotations

import json
import sys

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from engine.runtime.model import tiny_models as tm
from engine.runtime.model.draft_files import MTP_WEIGHTS_FILE
from engine.runtime.model.fingerprint import model_fingerprint
from engine.runtime.speculative.mtp import lm_logits, load_mtp, next_next_logits

CHANCE = 1 / tm.VOCAB_SIZE
needs_corpus = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11), reason="the corpus is CPython 3.11's stdlib"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tm.ensure_default_model(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    model, tokenizer = mlx_lm.load(str(model_dir))
    return model, tokenizer, load_mtp(model_dir, model)


@pytest.fixture(scope="module")
def corpus():
    from scripts import tiny_corpus

    return tiny_corpus.load_corpus(tiny_corpus.load_tokenizer())


# ---------------------------------------------------------------- shipping


def test_shipped_files_fit_the_package_budget():
    sizes = {name: (tm.EMBEDDED_DIR / name).stat().st_size for name in tm.EMBEDDED_FILES}
    assert sum(sizes.values()) <= 16 << 20, sizes
    config = json.loads((tm.EMBEDDED_DIR / "config.json").read_text())
    assert config == tm.config_for("qwen3_next", "embedded")


def test_default_model_is_the_shipped_one(model_dir, loaded):
    model, tokenizer, _ = loaded
    assert model_dir.name.startswith("qwen3_next-embedded-")
    shipped = mx.load(str(tm.EMBEDDED_DIR / tm.WEIGHTS_FILE))
    weights = tm.model_weights(model)
    assert set(weights) == set(shipped)
    assert all(mx.array_equal(weights[k], shipped[k]).item() for k in shipped)
    assert all(v.dtype == mx.float32 for v in weights.values())  # served as float32
    assert tokenizer.eos_token_ids == {tm.IM_END_ID, tm.ENDOFTEXT_ID}


def test_trained_weights_change_the_fingerprint(model_dir, tmp_path):
    random_dir = tm.write_model_dir("qwen3_next", tmp_path / "random")
    trained = model_fingerprint(model_dir, "float32")
    assert trained != model_fingerprint(random_dir, "float32")
    # The MTP head's file is one of the weight files the fingerprint keys.
    (model_dir / MTP_WEIGHTS_FILE).touch()
    assert model_fingerprint(model_dir, "float32") != trained


def test_random_qwen3_next_stays_available():
    a, b = tm.build_model("qwen3_next"), tm.build_model("qwen3_next")
    assert mx.array_equal(a.lm_head.weight, b.lm_head.weight).item()
    assert a.args.hidden_size != tm.config_for("qwen3_next", "embedded")["hidden_size"]


# ---------------------------------------------------------------- MTP head


def test_mtp_head_loads_from_the_checkpoint_names(loaded):
    model, _, head = loaded
    assert head is not None
    names = set(mx.load(str(tm.EMBEDDED_DIR / MTP_WEIGHTS_FILE)))
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight"} <= names
    assert {"mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"} <= names
    assert "mtp.layers.0.self_attn.q_proj.weight" in names
    assert all(n.startswith("mtp.") for n in names)


def test_mtp_head_is_absent_or_rejected_elsewhere(tmp_path):
    random_dir = tm.write_model_dir("qwen3_next", tmp_path / "random")
    model, _ = mlx_lm.load(str(random_dir))
    assert load_mtp(random_dir, model) is None
    # The embedded head does not fit the tiny random shape: a clear error, not garbage.
    (random_dir / MTP_WEIGHTS_FILE).write_bytes((tm.EMBEDDED_DIR / MTP_WEIGHTS_FILE).read_bytes())
    with pytest.raises(ValueError, match="do not fit"):
        load_mtp(random_dir, model)


def test_mtp_cache_decode_matches_the_whole_sequence(loaded):
    """Fed one (h_t, token t+1) pair at a time through its KV cache, the head gives what
    it gives over the whole sequence at once."""
    model, _, head = loaded
    tokens = mx.array([[(5 + 97 * i) % 4000 for i in range(40)]])
    whole = next_next_logits(model, head, tokens)
    hidden = model.model(tokens)
    cache = head.make_cache()
    steps = [
        head(hidden[:, t : t + 1], tokens[:, t + 1 : t + 2], model.model.embed_tokens, cache)
        for t in range(tokens.shape[1] - 1)
    ]
    stepped = lm_logits(model, mx.concatenate(steps, axis=1))
    assert mx.allclose(stepped, whole, atol=1e-4).item()


@needs_corpus
def test_mtp_predicts_the_token_after_next_well_above_chance(loaded, corpus):
    from scripts import tiny_corpus

    model, _, head = loaded
    windows = tiny_corpus.heldout_windows(corpus, 257, 8)
    tokens = mx.array(windows)
    logits = next_next_logits(model, head, tokens)[:, :-1]
    top1 = (mx.argmax(logits, axis=-1) == tokens[:, 2:]).mean().item()
    assert top1 > 100 * CHANCE and top1 > 0.25, top1


# ---------------------------------------------------------------- what it learned


@needs_corpus
def test_heldout_loss_is_far_below_a_uniform_guess(loaded, corpus):
    from scripts import tiny_corpus, tiny_eval

    model, _, head = loaded
    metrics = tiny_eval.heldout_metrics(model, head, tiny_corpus.heldout_windows(corpus, 257, 8))
    assert metrics["heldout_loss"] < 0.5 * np.log(tm.VOCAB_SIZE), metrics
    assert metrics["heldout_top1"] > 0.35, metrics


@needs_corpus
def test_copies_a_heldout_snippet_from_its_prompt(loaded, corpus):
    from scripts import tiny_corpus, tiny_eval

    model, _, _ = loaded
    snippets = tiny_corpus.heldout_snippets(corpus, 4, 10)
    accuracy = tiny_eval.copy_accuracy(model, tiny_corpus.load_tokenizer(), snippets)
    # docs/model.md: 0.30 over 16 snippets (0.34 over these 4); untrained, ~0.05.
    assert accuracy > 0.2, accuracy


def test_writes_python_shaped_text(loaded):
    model, tokenizer, _ = loaded
    prompt = tokenizer.encode("class Parser:\n    def __init__(self, path):\n")
    # Decoded whole: mlx-lm's streaming detokenizer drops the first token's leading space.
    ids = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=40)]
    text = tokenizer.decode(ids)
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines and lines[0].startswith("        "), text  # the method's body, indented
    assert "self" in text, text
