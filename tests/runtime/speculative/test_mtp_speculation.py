"""MTP drafts: the trained embedded model's head drafts, greedy output stays plain decoding's.

The embedded model ships a trained MTP head, so its drafts are accepted often
and rejected often (both are asserted): every verify path runs, with the head
chaining one or two drafts, at batch 1 and with prompts admitted while others
decode. The head's own cache is checked against a head run from scratch over
each row's decoded pairs: it holds the kept positions and nothing else.
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import CacheList

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.model import tiny_models as tm
from engine.runtime.speculative.mtp import NextNHead, load_mtp
from engine.runtime.speculative.mtp_costs import HeadCosts
from engine.runtime.speculative.speculation import speculation_for
from engine.runtime.speculative.speculative_batch import Speculation, SpeculativeGenerationBatch
from tests.runtime.model.test_trained_model import loaded, model_dir
from tests.runtime.speculative.test_rollback import rel_l2
from tests.runtime.speculative.test_speculative import _chunked, _run
from tests.runtime.speculative.test_speculative_sampling import CRITICAL, _first_tokens

TEXTS = [
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return",
    "import os\nimport sys\n\n\nclass Reader:\n    def __init__(self, path):\n        self.",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "for i in range(10):\n    print(i)\nfor j in range(",
]


# The embedded model and its head: (model, tokenizer, head), and its directory.
trained, model_dir = loaded, model_dir


def _prompts(tokenizer, n):
    return [tokenizer.encode(TEXTS[i % len(TEXTS)] * (1 + i // 4)) for i in range(n)]


@pytest.mark.parametrize("batch", [1, 6])
@pytest.mark.parametrize("chain", [1, 2])
def test_mtp_greedy_is_plain_decoding(trained, batch, chain):
    model, tokenizer, head = trained
    prompts = _prompts(tokenizer, batch)
    late = tuple(range(batch // 2, batch)) if batch > 1 else ()
    plain, _ = _run(_chunked(model), prompts, late)
    gen = _chunked(model, Speculation(None, chain, mtp=head))
    batch_ = gen._generation_batch
    spoken, _ = _run(gen, prompts, late)
    assert spoken == plain
    stats = batch_.stats
    assert stats.verify_steps > 0 and stats.head_ms > 0
    assert stats.accepted_all and (stats.accepted_none or batch == 1)  # right, and wrong
    assert chain == 1 or stats.accepted_some
    assert batch_.mtp.cache is None  # every row left: its head context with it


@pytest.fixture(scope="module")
def glm_dsa(tmp_path_factory):
    """glm_moe_dsa with a random DeepSeek-style head written the way checkpoints ship it."""
    model_dir = tm.write_model_dir("glm_moe_dsa", tmp_path_factory.mktemp("glm"))
    model, _ = mlx_lm.load(str(model_dir))
    written = _write_nextn_head(model, model_dir)
    model, _ = mlx_lm.load(str(model_dir))  # the shard with layer N is read and dropped
    return model, model_dir, written


@pytest.mark.parametrize("arch", ["qwen3_next", "glm_moe_dsa"])
def test_head_cache_holds_the_kept_pairs_only(request, arch):
    """After decoding with rejections, each row's head KV equals a fresh head run over the
    row's positions: its prompt's prefilled ones (all but the last, which mlx-lm's first
    decode step feeds: skipped, its rope position stepped over), then its decoded ones,
    each (h_t, token t+1) of accepted tokens only."""
    if arch == "qwen3_next":
        model, tokenizer, head = request.getfixturevalue("trained")
        prompts = _prompts(tokenizer, 3)
    else:
        model, model_dir, _ = request.getfixturevalue("glm_dsa")
        head = load_mtp(model_dir, model)
        rng = np.random.default_rng(7)
        prompts = [rng.integers(3, 4000, size=n).tolist() for n in (20, 31, 26)]
    gen = _chunked(model, Speculation(None, 2, mtp=head), max_tokens=200)
    uids = gen.insert_segments([[p] for p in prompts])
    batch = gen._generation_batch
    for _ in range(40):  # until every row decoded a while, and some draft was rejected
        gen.next()
        if len(batch.uids) == 3 and min(map(len, batch.tokens)) > 40:
            if batch.stats.accepted_none:
                break
    assert batch.stats.accepted_none > 0
    cache = batch.mtp.cache[0]
    kv = cache[0] if type(cache) is CacheList else cache  # DSA: the latent KV, then the keys
    padding = kv.left_padding.tolist()
    checked = 0
    for r, uid in enumerate(batch.uids):
        fed = batch.tokens[r]  # the prompt and every kept token, the caches hold exactly these
        n = len(prompts[uids.index(uid)])
        seq = fed + [int(batch._next_tokens[r].item())]
        keys = kv.keys[r : r + 1, :, padding[r] : kv._idx]
        values = kv.values[r : r + 1, :, padding[r] : kv._idx]  # MLA: the rotated part
        assert keys.shape[2] == len(seq) - 2, (r, keys.shape, len(seq), n)
        hidden = model.model(mx.array([seq[:-1]]))
        fresh = head.batch_cache(1)
        parts = fresh.caches if type(fresh) is CacheList else (fresh,)
        embed = model.model.embed_tokens
        head(hidden[:, : n - 1], mx.array([seq[1:n]]), embed, [fresh])  # the prompt's
        for part in parts:  # position n - 1: not read
            part.offset = part.offset + 1
        if len(seq) > n + 1:
            head(hidden[:, n:], mx.array([seq[n + 1 :]]), embed, [fresh])  # the decoded ones
        assert rel_l2(keys, parts[0].keys[..., : parts[0]._idx, :]) <= 1e-4
        assert rel_l2(values, parts[0].values[..., : parts[0]._idx, :]) <= 1e-4
        checked += keys.shape[2]
    assert checked >= 8
    gen.close()


def test_mtp_is_refused_for_a_model_without_a_head(tmp_path):
    path = tm.write_model_dir("qwen3_next", tmp_path / "random")
    config = EngineConfig(
        model=ModelConfig(path=str(path), speculative="mtp"),
        cache=CacheConfig(cache_dir=str(tmp_path / "cache")),
    )
    model, _ = mlx_lm.load(str(path))
    with pytest.raises(ValueError, match="--speculative mtp: .* has no MTP head"):
        speculation_for(config, model)


def test_mtp_mode_loads_the_head(trained, model_dir, tmp_path):
    model = trained[0]
    config = EngineConfig(
        model=ModelConfig(path=str(model_dir), speculative="mtp", num_draft_tokens=2),
        cache=CacheConfig(cache_dir=str(tmp_path)),
    )
    speculation = speculation_for(config, model)
    assert speculation.mtp is not None and speculation.mtp_chain == 2
    off = dataclasses.replace(config, model=dataclasses.replace(config.model, speculative="off"))
    assert speculation_for(off, model) is None
    assert np.isfinite(float(speculation.mtp.fc.weight.abs().sum()))


def _write_nextn_head(model, model_dir, seed: int = 3):
    """A random DeepSeek-style head saved as a checkpoint ships it: `model.layers.{N}.*` in a
    model shard of its own, experts one by one (mlx-lm's sanitize stacks them)."""
    mx.random.seed(seed)
    head = NextNHead(model)
    prefix = f"model.layers.{model.args.num_hidden_layers}."
    raw = {}
    for name, value in tree_flatten(head.parameters()):
        if ".switch_mlp." in name:  # layers.0.mlp.switch_mlp.gate_proj.weight -> experts.e
            for e in range(value.shape[0]):
                raw[prefix + name[len("layers.0.") :].replace("switch_mlp", f"experts.{e}")] = (
                    value[e]
                )
        else:
            raw[prefix + name.removeprefix("layers.0.")] = value
    raw[prefix + "embed_tokens.weight"] = model.model.embed_tokens.weight  # DeepSeek's copy
    mx.save_safetensors(str(model_dir / "model-nextn.safetensors"), raw)
    return head


@pytest.mark.parametrize("batch", [1, 5])
def test_glm_dsa_nextn_head_loads_and_drafts_exactly(glm_dsa, batch):
    """glm_moe_dsa (DSA attention: the head's cache is a CacheList of latent KV and indexer
    keys): the head written as a checkpoint ships it loads through mlx-lm's own load (which
    drops it) and `load_mtp`, equal to what was written; speculation with it is greedy."""
    model, model_dir, written = glm_dsa
    head = load_mtp(model_dir, model)
    assert isinstance(head, NextNHead)
    pairs = zip(tree_flatten(head.parameters()), tree_flatten(written.parameters()))
    for (name, a), (_, b) in pairs:
        assert mx.array_equal(a, b), name
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(3, 4000, size=int(rng.integers(12, 40))).tolist() for _ in range(batch)]
    late = tuple(range(batch // 2, batch)) if batch > 1 else ()
    plain, _ = _run(_chunked(model), prompts, late)
    gen = _chunked(model, Speculation(None, 2, mtp=head))
    stats = gen._generation_batch.stats
    assert _run(gen, prompts, late)[0] == plain
    assert stats.verify_steps > 0 and stats.accepted_none > 0


def test_mtp_sampling_keeps_the_distribution(trained, monkeypatch):
    """Temperature 1, top-k 3: the first three tokens of 320 seeded requests, plain and with
    the head's drafts (the third token is a verified draft's outcome), cannot be told apart
    (chi-square of the contingency table, p = 0.001); the drafts were accepted and rejected."""
    model, _, head = trained
    seeds = list(range(2000, 2000 + 320))
    plain = _first_tokens(model, None, seeds)
    batches = []
    speculating = SpeculativeGenerationBatch.speculating

    def kept(*args):
        batches.append(speculating(*args))
        return batches[-1]

    monkeypatch.setattr(SpeculativeGenerationBatch, "speculating", kept)
    spec = _first_tokens(model, Speculation(None, 1, mtp=head), [s + 7 for s in seeds])
    assert sum(b.stats.accepted_all for b in batches) > 50
    assert sum(b.stats.accepted_none for b in batches) > 50
    cells = sorted(set(plain) | set(spec))
    a = np.array([plain.count(c) for c in cells], dtype=float)
    b = np.array([spec.count(c) for c in cells], dtype=float)
    total = a + b
    statistic = float(((a - b) ** 2 / total).sum())
    assert len(cells) <= 27
    assert statistic < CRITICAL[26], (statistic, len(cells))


def test_head_pays_where_a_step_with_its_draft_is_cheaper_per_token():
    # A large model on a GPU: the head is one layer of many, two tokens cost one.
    assert HeadCosts(plain_ms=20.0, verify_ms=21.0, head_ms=0.6, replay_ms=0.0).pays()
    # The embedded model on this CPU (as measured at load): the head is a fifth of a step.
    assert not HeadCosts(plain_ms=2.9, verify_ms=4.1, head_ms=2.0, replay_ms=2.9).pays()
    # A draft that is never accepted never pays; one always accepted nearly doubles.
    costs = HeadCosts(plain_ms=10.0, verify_ms=12.0, head_ms=1.0, replay_ms=5.0)
    assert not costs.pays(rate=0.0) and costs.pays(rate=1.0)


@pytest.mark.parametrize("pays", [False, True])
def test_auto_takes_the_head_where_it_pays(trained, model_dir, tmp_path, monkeypatch, pays):
    """auto measures the head at load: where it pays, rows draft from lookup first and the
    head otherwise, greedy output unchanged; where it does not, lookup alone."""
    model, tokenizer, head = trained
    monkeypatch.setattr(HeadCosts, "pays", lambda self, rate=0.6: pays)
    config = EngineConfig(
        model=ModelConfig(path=str(model_dir), speculative="auto"),
        cache=CacheConfig(cache_dir=str(tmp_path)),
    )
    speculation = speculation_for(config, model)
    assert (speculation.mtp is not None) == pays and speculation.source is not None
    prompts = _prompts(tokenizer, 4)
    plain, _ = _run(_chunked(model), prompts, (2, 3))
    gen = _chunked(model, speculation)
    batch = gen._generation_batch
    assert _run(gen, prompts, (2, 3))[0] == plain
    assert batch.stats.verify_steps > 0 and (batch.stats.head_ms > 0) == pays
    # lookup's guesses went first: more than one draft a verify (the head drafts one)
    assert any(c.drafted > c.verifies for c in batch.stats.counts.values())


def test_prompt_tails_leave_with_their_sequences(trained):
    """A sequence removed during its prefill takes its prompt tail with it; one that starts
    decoding hands it to the head: nothing stays behind."""
    model, tokenizer, head = trained
    gen = _chunked(model, Speculation(None, 1, mtp=head), max_tokens=8)
    tails = gen._generation_batch.tails
    long_prompt = _prompts(tokenizer, 1)[0] * 6  # several 16-token chunks
    kept, removed = gen.insert_segments([[_prompts(tokenizer, 2)[1]], [long_prompt]])
    while removed not in tails.rows:
        gen.next()
    gen.remove([removed])
    assert removed not in tails.rows
    while gen._generation_batch.uids or kept in tails.rows or gen.cohorts:
        gen.next()
    assert not tails.rows
    gen.close()


@pytest.mark.parametrize("chunked", [False, True])
def test_mtp_under_a_grammar_is_masked_plain_decoding(trained, chunked):
    """Rows held to a JSON schema and a tool-call grammar beside free rows: the head drafts for
    every row, the grammar cuts held rows' drafts and masks their verify positions, and
    greedy output is masked plain decoding's, each matcher holding its row's tokens."""
    from engine.runtime.structured.matcher import Grammars

    from .test_speculative_constraint import END, _generator, _prompts, _run, _same_state

    model, tokenizer, head = trained
    grammars = Grammars(tokenizer, model.args.vocab_size, {END})
    kinds = ["schema", None, "tool", None]
    prompts = _prompts(tokenizer, len(kinds))
    check = _same_state(grammars)
    plain = _run(_generator(model, None, chunked), grammars, prompts, kinds, check=check)
    gen = _generator(model, Speculation(None, 2, mtp=head), chunked)
    stats = gen._generation_batch.stats
    assert _run(gen, grammars, prompts, kinds, check=check) == plain
    assert stats.verify_steps > 0 and stats.matcher_ms > 0 and stats.head_ms > 0
    assert stats.accepted_all and stats.plain_steps == 0
