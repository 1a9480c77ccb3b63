"""Draft sources and draft lengths, plain Python: the n-gram index and auto's choices."""

from __future__ import annotations

from engine.runtime.speculative.draft_length import (
    AUTO_MAX,
    MIN_COOLDOWN,
    DraftLength,
    StepCosts,
    batch_k,
    expected_tokens,
)
from engine.runtime.speculative.drafts import NgramIndex, PromptLookup


def test_lookup_drafts_what_followed_the_longest_recent_match():
    file = list(range(100, 160))
    context = file + [7, 8] + file[:10]  # re-emitting the file
    assert PromptLookup().propose(0, context, 5) == file[10:15]
    # The longest n-gram wins over a more recent shorter one.
    context = [1, 2, 3, 4, 50, 9, 3, 4, 60, 1, 2, 3, 4]
    assert NgramIndex().propose(context, 2) == [50, 9]


def test_lookup_never_matches_the_context_end_itself_and_grows_with_it():
    index = NgramIndex()
    assert index.propose([1, 2, 3], 4) == []  # no earlier occurrence
    assert index.propose([1, 2, 3, 1, 2], 4) == [3, 1, 2]
    assert index.propose([1, 2, 3, 1, 2, 3, 9], 4) == []
    assert index.propose([5, 6], 2) == []  # a shorter context: indexed anew


def test_a_sequence_whose_drafts_fail_rests_and_comes_back():
    length = DraftLength(None)
    assert length.wanted() == AUTO_MAX
    for _ in range(4):
        length.verified(4, 0)
    assert length.wanted() == 0 and length.resting == MIN_COOLDOWN
    length.decoded(MIN_COOLDOWN)
    assert length.wanted() == AUTO_MAX
    for _ in range(4):  # failing again rests twice as long
        length.verified(4, 0)
    assert length.resting == 2 * MIN_COOLDOWN
    fixed = DraftLength(3)
    for _ in range(8):
        fixed.verified(3, 0)
    assert fixed.wanted() == 3


def test_auto_k_follows_acceptance_and_cost():
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0
    cheap = StepCosts()  # a small model: the fixed cost dominates
    for n, ms in [(1, 10.0), (5, 11.0), (9, 12.0)]:
        cheap.record(n, ms)
    steep = StepCosts()  # a full batch on a busy CPU: every token counts
    for n, ms in [(8, 12.0), (24, 30.0), (40, 44.0)]:
        steep.record(n, ms)
    assert batch_k([0.95], cheap) >= 6
    assert batch_k([0.1], cheap) <= 1
    assert batch_k([0.5] * 8, steep) == 0
    assert 1 <= batch_k([0.95] * 8, steep) < batch_k([0.95], cheap)
    assert batch_k([None, None], cheap) == 0
    assert batch_k([0.9], StepCosts()) == AUTO_MAX  # nothing measured yet


def test_bad_draft_settings_are_refused_naming_the_flag():
    import pytest

    from engine.config import ModelConfig

    with pytest.raises(ValueError, match=r"--speculative .*draft needs --draft-model"):
        ModelConfig(speculative="draft")
    with pytest.raises(ValueError, match="--num-draft-tokens"):
        ModelConfig(num_draft_tokens=0)
    assert ModelConfig(speculative="auto", num_draft_tokens=3).num_draft_tokens == 3
