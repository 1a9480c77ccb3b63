"""A draft model as the draft source: greedy output stays the plain run's, token for token.

Real MLX models throughout: the draft is the target itself (every draft is
accepted, so acceptance must be 100%), or a random-weight model of another
architecture with the same vocabulary (llama and mamba2 drafts for a
qwen3_next target: most drafts rejected, the draft's own KV trimmed and its
recurrent state restored). After a rejection the draft's caches equal a fresh
prefill of the surviving context. The configuration refuses what cannot work.
"""

from __future__ import annotations

import dataclasses
import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from clients.cli import main as cli
from clients.cli.args import config_from_args
from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.model.draft_files import check_draft, load_draft
from engine.runtime.model.tiny_models import build_model, write_model_dir
from engine.runtime.speculative.draft_model import DraftModel, LookupOrDraft
from engine.runtime.speculative.drafts import PromptLookup
from engine.runtime.speculative.speculation import speculation_for
from engine.runtime.speculative.speculative_batch import Speculation
from tests.runtime.speculative.test_rollback import rel_l2
from tests.runtime.speculative.test_speculative import _chunked, _prompts, _run


def _states(caches) -> list:
    return [a for c in caches for _, a in tree_flatten(c.state) if isinstance(a, mx.array)]


def _assert_fresh(draft: DraftModel, uid: int) -> None:
    """The row's caches are what a fresh prefill of the tokens it holds leaves."""
    row = draft.rows[uid]
    fresh = make_prompt_cache(draft.model)
    draft.model(mx.array([row.fed]), cache=fresh)
    ours, theirs = _states(row.caches), _states(fresh)
    assert len(ours) == len(theirs) and ours
    for a, b in zip(ours, theirs):
        assert rel_l2(a, b) <= 1e-5


@pytest.mark.parametrize("batch", [1, 8])
def test_target_as_its_own_draft_accepts_everything(batch):
    target = build_model("qwen3_next")
    prompts = _prompts(batch, seed=batch)
    late = tuple(range(batch // 2, batch)) if batch > 1 else ()
    plain, _ = _run(_chunked(target), prompts, late)
    draft = DraftModel(build_model("qwen3_next"), prefill_step=16)
    gen = _chunked(target, Speculation(draft, 4))
    stats = gen._generation_batch.stats
    spoken, _ = _run(gen, prompts, late)
    assert spoken == plain
    assert stats.verify_steps > 0 and stats.accepted_all > 0
    assert stats.accepted_some == stats.accepted_none == 0  # the same model: all accepted
    assert draft.rewinds == 0 and not draft.rows  # every finished row was forgotten


@pytest.mark.parametrize("arch", ["llama", "mamba2"])
@pytest.mark.parametrize("batch", [1, 8])
def test_other_architecture_draft_keeps_greedy_output(arch, batch):
    target = build_model("qwen3_next")
    prompts = _prompts(batch, seed=10 + batch)
    late = tuple(range(batch // 2, batch)) if batch > 1 else ()
    plain, _ = _run(_chunked(target), prompts, late)
    draft = DraftModel(build_model(arch, seed=7), prefill_step=16)
    gen = _chunked(target, Speculation(draft, 3))
    stats = gen._generation_batch.stats
    spoken, _ = _run(gen, prompts, late)
    assert spoken == plain
    assert stats.verify_steps > 0 and stats.accepted_none > 0
    assert draft.rewinds > 0  # its own caches were rolled back
    assert draft.restarts == 0  # and never prefilled a row again


@pytest.mark.parametrize("arch", ["llama", "mamba2", "qwen3_next"])
def test_rejected_drafts_leave_the_draft_as_a_fresh_prefill(arch):
    draft = DraftModel(build_model(arch, seed=3), prefill_step=8)
    context = _prompts(1, seed=4)[0][:30]  # > prefill_step: the first prefill is chunked
    drafts = draft.propose(0, context, 4)
    assert len(drafts) == 4
    assert draft.rows[0].fed == context + drafts[:3]
    # The target kept one draft and said something else next.
    other = (drafts[1] + 1) % 4000 + 3
    surviving = context + drafts[:1] + [other]
    again = draft.propose(0, surviving, 4)
    assert draft.rewinds == 1 and len(again) == 4
    assert draft.rows[0].fed == surviving + again[:3]
    _assert_fresh(draft, 0)
    # Every draft accepted, then one more token: no rewind, caught up in one forward.
    longer = surviving + again + [5]
    draft.propose(0, longer, 2)
    assert draft.rewinds == 1
    _assert_fresh(draft, 0)
    # Every draft rejected, the context ending at the mark (the batch asks before the
    # token in flight is known): back to the mark, drafting from what it said there.
    mark = draft.rows[0].mark
    fed = list(draft.rows[0].fed)
    assert draft.propose(0, fed[:mark], 3)[0] == fed[mark]
    assert draft.rewinds == 2 and draft.restarts == 0
    _assert_fresh(draft, 0)
    # A context that is exactly what was fed: drafts continue from the kept guess.
    fed = list(draft.rows[0].fed)
    guess = draft.rows[0].guess
    assert draft.propose(0, fed, 2)[0] == guess
    # A context that left what was fed before the mark: the row starts again, exactly.
    diverged = [t + 1 for t in context[:5]] + context[5:]
    assert draft.propose(0, diverged, 3) == DraftModel(draft.model).propose(0, diverged, 3)
    assert draft.restarts == 1
    _assert_fresh(draft, 0)
    draft.forget(0)
    assert not draft.rows


def test_lookup_first_then_the_draft_model():
    draft = DraftModel(build_model("llama", seed=3))
    both = LookupOrDraft(draft)
    repeated = [11, 12, 13, 14, 15, 16, 11, 12, 13]
    assert both.propose(0, repeated, 3) == [14, 15, 16]  # a 3-gram match: lookup's
    assert not draft.rows  # the draft model was not asked
    fresh = [21, 22, 23, 24, 25]
    assert both.propose(1, fresh, 3) == draft.propose(2, fresh, 3)  # no match: the draft's
    both.forget(1)
    assert 1 not in draft.rows


def test_config_refuses_what_cannot_draft():
    with pytest.raises(ValueError, match="--draft-model"):
        ModelConfig(speculative="draft")
    with pytest.raises(ValueError, match="--draft-model.*draft or auto, not lookup"):
        ModelConfig(speculative="lookup", draft_model="/somewhere")
    with pytest.raises(ValueError, match="--draft-model"):
        ModelConfig(draft_model="/somewhere")  # speculative off
    ModelConfig(speculative="auto", draft_model="/somewhere")  # fine until it is loaded
    # Its flag and variable, with their partner.
    env = {"LINEAGE_SPECULATIVE": "draft", "LINEAGE_DRAFT_MODEL": "/d"}
    assert EngineConfig.from_sources({}, env).model.draft_model == "/d"
    args = cli.build_parser().parse_args(["serve", "--speculative", "draft", "--draft-model", "/e"])
    assert config_from_args(args, env).model.draft_model == "/e"


def _serving(tmp_path, **model):
    """An EngineConfig serving a random-weight qwen3_next (no MTP head), and that model."""
    target = write_model_dir("qwen3_next", tmp_path / "target")
    config = EngineConfig(
        model=ModelConfig(path=str(target), **model),
        cache=CacheConfig(cache_dir=str(tmp_path / "cache")),
    )
    return config, load_draft(str(target))[0]


def test_speculation_for_builds_the_draft_sources(tmp_path, monkeypatch):
    from engine.runtime.speculative import draft_model

    path = str(write_model_dir("llama", tmp_path / "draft"))
    config, target = _serving(tmp_path, speculative="draft", draft_model=path)
    spec = speculation_for(config, target)
    assert isinstance(spec.source, DraftModel)
    assert spec.source.model is load_draft(path)[0]  # loaded once per process
    monkeypatch.setattr(draft_model, "PAYING_COST", 10.0)
    auto = dataclasses.replace(config.model, speculative="auto")
    spec = speculation_for(dataclasses.replace(config, model=auto), target)
    assert isinstance(spec.source, LookupOrDraft)
    alone = dataclasses.replace(config.model, speculative="auto", draft_model=None)
    spec = speculation_for(dataclasses.replace(config, model=alone), target)
    assert isinstance(spec.source, PromptLookup)


def test_auto_takes_the_draft_model_only_where_it_pays(tmp_path, monkeypatch):
    from engine.runtime.speculative import draft_model

    path = str(write_model_dir("llama", tmp_path / "draft"))
    same = load_draft(path)[0]  # as the served model: its step costs the whole step
    config, _ = _serving(tmp_path, speculative="auto", draft_model=path)
    assert draft_model.draft_pays(same, same)[1] > 0.5
    assert isinstance(speculation_for(config, same).source, PromptLookup)
    monkeypatch.setattr(draft_model, "PAYING_COST", 10.0)
    assert isinstance(speculation_for(config, same).source, LookupOrDraft)
    # --speculative draft drafts with it whatever it costs
    monkeypatch.setattr(draft_model, "PAYING_COST", 0.0)
    drafting = dataclasses.replace(config.model, speculative="draft")
    spec = speculation_for(dataclasses.replace(config, model=drafting), same)
    assert isinstance(spec.source, DraftModel)


def test_check_draft_refuses_another_vocabulary_and_a_missing_path(tmp_path):
    target = tmp_path / "target"
    write_model_dir("qwen3_next", target)
    _, tokenizer = load_draft(str(target))
    same = write_model_dir("llama", tmp_path / "same")
    check_draft(str(same), tokenizer)  # the same tokenizer: accepted
    other = write_model_dir("llama", tmp_path / "other")
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # the same size, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="--draft-model .*vocabulary"):
        check_draft(str(other), tokenizer)
    with pytest.raises(ValueError, match="--draft-model .*no config.json"):
        check_draft(str(tmp_path / "missing"), tokenizer)


def test_an_engine_serves_with_a_draft_model_across_a_warm_turn(tmp_path):
    """The whole path: load (the draft checked), the batch built with it, a second turn
    restored from the lineage cache while the draft prefills the whole context."""
    import dataclasses

    import numpy as np

    from engine.runtime.local import LocalEngine
    from tests.runtime.speculative.test_speculative_cache import _config, _conversation

    model_dir = write_model_dir("qwen3_next", tmp_path / "model")
    draft_dir = str(write_model_dir("mamba2", tmp_path / "draft"))
    rng = np.random.default_rng(3)
    first, second = rng.integers(3, 4000, size=150).tolist(), rng.integers(3, 4000, 40).tolist()
    want = _conversation(LocalEngine(_config(model_dir, tmp_path / "a", "off")), first, second)
    config = _config(model_dir, tmp_path / "b", "off")
    model = dataclasses.replace(config.model, speculative="draft", draft_model=draft_dir)
    engine = LocalEngine(dataclasses.replace(config, model=model))
    source = engine.generator.bg._generation_batch.speculation.source
    got = _conversation(engine, first, second)
    assert [g.ids for g in got] == [w.ids for w in want]
    assert got[1].final.cached_tokens == want[1].final.cached_tokens > 0  # a warm turn
    assert isinstance(source, DraftModel) and source.rewinds > 0 and not source.rows
    # A draft of another vocabulary is refused when the engine starts.
    other = write_model_dir("llama", tmp_path / "other")
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[200:202]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    model = dataclasses.replace(model, draft_model=str(other))
    with pytest.raises(ValueError, match="--draft-model"):
        LocalEngine(dataclasses.replace(config, model=model))
