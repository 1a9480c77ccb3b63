"""The lineage policy's events, table-driven with exact plans and orders.

Token ids are plain ranges: seq(a, n) never shares a token with a range that
starts elsewhere, so the longest common prefixes are exact by construction.
"""

from __future__ import annotations

import pytest

from engine.cache.entry import Checkpoint
from engine.cache.messages import CheckpointMove, Orders
from engine.cache.thinning import thin
from tests.fakes import KVPT, STATE, Driver, entry_bytes, tokens


def seq(start: int, n: int) -> range:
    return range(start, start + n)


P1 = seq(1000, 600)  # a first prompt: system + tools + user
R1 = seq(5000, 20)  # its reply


def caps(plan) -> list[tuple]:
    return [(c.length, c.kind, c.entry_id) for c in plan.captures]


def moves(*triples) -> tuple[CheckpointMove, ...]:
    return tuple(CheckpointMove(*t) for t in triples)


# -- guard -------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt_len, captures, checkpoints",
    [
        (600, [(584, "guard", None)], {584: "guard", 600: "reply"}),
        (256, [(240, "guard", None)], {240: "guard", 256: "reply"}),
        (255, [], {255: "reply"}),  # uncached suffix under 256: no guard
        (40, [], {40: "reply"}),
    ],
)
def test_guard_only_for_a_long_uncached_suffix(prompt_len, captures, checkpoints):
    d = Driver()
    plan, orders = d.turn(seq(1000, prompt_len), R1)
    assert (plan.entry_id, plan.length, plan.kind, plan.new_entry_id) == (None, 0, "none", 1)
    assert caps(plan) == captures and plan.store_reply
    assert orders == Orders()
    assert d.checkpoints(1) == checkpoints


def test_verbatim_resend_restores_the_whole_prompt_at_its_end_and_prefills_nothing():
    """A retry of a dropped call: the prompt end kept its logits, so nothing is prefilled;
    the new reply replaces the old one (the client never saw it)."""
    d = Driver()
    d.turn(P1, R1)
    plan, orders = d.turn(P1, seq(6000, 20))
    assert (plan.entry_id, plan.length, plan.kind, caps(plan)) == (1, 600, "reply", [])
    assert orders == Orders(moves=moves((1, 584, 2)), free=(1,))
    assert d.checkpoints(2) == {584: "guard", 600: "reply"}
    assert d.entry(2).logits_at == 600


def test_a_resend_without_the_prompt_ends_logits_keeps_one_uncached_token():
    d = Driver()
    d.turn(P1, R1)
    d.entry(1).logits_at = None  # e.g. read back from its file: logits live in RAM only
    plan, orders = d.turn(P1, seq(6000, 20))
    assert (plan.entry_id, plan.length, plan.kind) == (1, 584, "guard")
    assert orders == Orders()  # restored before the prompt end: entry 1 stays a sibling


def test_a_short_turn_after_a_resend_restores_at_the_turn_boundary():
    d = Driver()
    d.turn(P1, R1)
    d.turn(tokens(P1, R1, seq(7000, 10)), seq(8000, 20))  # entry 2, absorbs 1
    plan, _ = d.turn(tokens(P1, R1, seq(7000, 10)), seq(9000, 5))  # resend
    assert (plan.entry_id, plan.length, plan.kind) == (2, 630, "reply")


# -- final (absorption) and reply ------------------------------------------------

ABSORPTION = {
    # turn 2 re-sends the reply verbatim: restores the whole entry, whose full state moves too
    "reply verbatim": (
        tokens(P1, R1, seq(7000, 10)),
        (1, 620, "entry"),
        moves((1, 584, 2), (1, 600, 2), (1, 620, 2)),
        {584: "guard", 600: "final", 620: "final", 630: "reply"},
    ),
    # the template re-renders the reply differently: lands on the prompt end; the tail is dropped
    "reply re-rendered": (
        tokens(P1, seq(6000, 20), seq(7000, 10)),
        (1, 600, "reply"),
        moves((1, 584, 2), (1, 600, 2)),
        {584: "guard", 600: "final", 630: "reply"},
    ),
}


@pytest.mark.parametrize(
    "prompt, restore, expected_moves, checkpoints", ABSORPTION.values(), ids=ABSORPTION
)
def test_a_next_turn_absorbs_its_source(prompt, restore, expected_moves, checkpoints):
    d = Driver()
    d.turn(P1, R1)
    plan, orders = d.turn(prompt, seq(8000, 20))
    assert (plan.entry_id, plan.length, plan.kind, caps(plan)) == (*restore, [])
    assert orders == Orders(moves=expected_moves, free=(1,))
    assert d.entry(1) is None and d.checkpoints(2) == checkpoints
    # entry 1's slot is freed
    assert d.manager.stats().ram_bytes == entry_bytes(650, len(checkpoints))


def test_an_empty_reply_moves_the_prompt_end_as_final():
    d = Driver()
    d.turn(P1, ())
    assert d.checkpoints(1) == {584: "guard"}
    plan, orders = d.turn(tokens(P1, seq(7000, 10)), seq(8000, 20))
    assert (plan.entry_id, plan.length, plan.kind) == (1, 600, "entry")
    assert orders == Orders(moves=moves((1, 584, 2), (1, 600, 2)), free=(1,))
    assert d.checkpoints(2) == {584: "guard", 600: "final", 610: "reply"}


def test_an_edited_last_message_lands_on_the_guard_and_keeps_both_lineages():
    d = Driver()
    d.turn(P1, R1)
    plan, orders = d.turn(tokens(seq(1000, 590), seq(7000, 40)), seq(8000, 20))
    assert (plan.entry_id, plan.length, plan.kind, caps(plan)) == (1, 584, "guard", [])
    assert orders == Orders()
    assert d.manager.stats().entries == 2


# -- anchor ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "anchor_len, captures",
    [
        (500, [(500, "anchor", 2), (584, "guard", None)]),
        (595, [(584, "guard", None), (595, "anchor", 2)]),  # after the guard: pinned all the same
        (600, [(584, "guard", None)]),  # the whole prompt: nothing left to prefill after it
    ],
)
def test_anchor_is_a_separate_entry_wherever_it_falls(anchor_len, captures):
    d = Driver()
    plan, orders = d.turn(P1, R1, anchor_len=anchor_len)
    assert caps(plan) == captures and orders == Orders()
    if anchor_len < 600:
        anchor = d.entry(2)
        assert (anchor.role, anchor.length, anchor.checkpoints) == ("anchor", anchor_len, {})
        assert d.checkpoints(1) == {584: "guard", 600: "reply"}
        assert d.manager.stats().anchor_bytes == entry_bytes(anchor_len)


def test_a_new_session_lands_on_the_anchor_which_is_never_absorbed():
    d = Driver()
    d.turn(P1, R1, anchor_len=500)
    plan, orders = d.turn(tokens(seq(1000, 500), seq(7000, 60)), seq(8000, 20), anchor_len=500)
    assert (plan.entry_id, plan.length, plan.kind, caps(plan)) == (2, 500, "anchor", [])
    assert orders == Orders()
    assert d.entry(2).role == "anchor" and d.manager.stats().hits == {"anchor": 1, "none": 1}


def test_no_anchor_capture_at_or_before_the_restore_point():
    d = Driver()
    d.turn(P1, R1)  # no anchor known yet
    plan, _ = d.turn(tokens(P1, R1, seq(7000, 10)), seq(8000, 20), anchor_len=500)
    assert plan.length == 620 and caps(plan) == []  # the state at 500 is never computed
    assert d.manager.stats().anchors == 0


def test_parallel_requests_pay_the_shared_anchor_once():
    """Sub-agents arriving together: the second waits for the first's anchor capture."""
    d = Driver()
    a = d.plan(tokens(seq(1000, 500), seq(7000, 100)), anchor_len=500)
    b = d.plan(tokens(seq(1000, 500), seq(8000, 100)), anchor_len=500)
    assert caps(a) == [(500, "anchor", 2), (584, "guard", None)]
    assert (b.entry_id, b.length, b.kind, b.wait) == (2, 500, "anchor", True)
    assert caps(b) == []  # 100 uncached tokens after the anchor: no guard
    d.restore(b.request_id)  # the actor holds it: the anchor is not stored yet
    assert d.capture_anchor(a.request_id) == Orders()  # a's prefill reaches the anchor
    assert d.manager.stats().anchors == 1
    assert d.commit(b.request_id, R1) == Orders()  # restored from the anchor
    assert d.commit(a.request_id, R1) == Orders()
    assert d.manager.stats().anchors == 1 and d.manager.stats().hits["anchor"] == 1


def test_a_waiter_prefills_cold_when_the_anchor_is_never_captured():
    d = Driver()
    a = d.plan(tokens(seq(1000, 500), seq(7000, 100)), anchor_len=500)
    b = d.plan(tokens(seq(1000, 500), seq(8000, 100)), anchor_len=500)
    assert b.wait
    assert d.release(a.request_id) == Orders(free=(1, 2))  # cancelled before its anchor
    d.commit(b.request_id, R1)  # the actor finds no anchor: cold, and says so
    assert d.manager.stats().anchors == 0 and d.entry(b.new_entry_id) is not None


def test_a_stored_anchor_is_not_captured_again():
    d = Driver()
    a = d.plan(tokens(seq(1000, 500), seq(7000, 100)), anchor_len=500)
    assert d.commit(a.request_id, R1) == Orders()
    b = d.plan(tokens(seq(1000, 500), seq(8000, 100)), anchor_len=500)
    assert (b.kind, b.wait) == ("anchor", False) and caps(b) == []


def test_a_second_anchor_with_the_same_tokens_is_freed_and_the_first_kept():
    """The index keeps one anchor per (namespace, tokens): a duplicate's id is freed."""
    from engine.cache.entry import Entry
    from engine.cache.index import Index
    from engine.cache.orders import OrderBook

    index, orders = Index(), OrderBook()
    first = Entry(1, "", "anchor", tokens(seq(1000, 500)), 500, KVPT, STATE)
    index.add(first)
    index.add(Entry(2, "", "conversation", tokens(seq(1000, 600)), 600, KVPT, STATE))
    index.add_unique(Entry(3, "", "anchor", tokens(seq(1000, 500)), 500, KVPT, STATE), orders)
    assert orders.build() == Orders(free=(3,)) and 3 not in index
    assert index.get(1) is first and first.last_used == 3, "the stored one is touched"
    index.add_unique(Entry(4, "", "anchor", tokens(seq(1000, 499)), 499, KVPT, STATE), orders)
    assert 4 in index, "other tokens: another anchor"


# -- divergence --------------------------------------------------------------------

SYS_A = tokens(seq(1000, 620), [1, 2, 3, 4], seq(1624, 16))  # 640 tokens
SYS_B = tokens(seq(1000, 620), [5, 6, 7, 8], seq(1624, 16))  # differs by 4 tokens near the end


def test_a_third_variant_lands_on_the_divergence_checkpoint():
    d = Driver()
    d.turn(tokens(SYS_A, seq(7000, 30)), R1)
    plan, _ = d.turn(tokens(SYS_B, seq(8000, 30)), R1)
    assert (plan.kind, caps(plan)) == ("none", [(620, "divergence", None), (654, "guard", None)])
    assert d.checkpoints(2) == {620: "divergence", 654: "guard", 670: "reply"}
    plan, orders = d.turn(tokens(seq(1000, 620), seq(9000, 50)), R1)
    assert (plan.entry_id, plan.length, plan.kind) == (2, 620, "divergence")
    assert orders == Orders() and d.manager.stats().hits["divergence"] == 1


def test_no_divergence_point_for_a_small_gain():
    d = Driver()
    d.turn(seq(1000, 300), R1)
    plan, _ = d.turn(tokens(seq(1000, 200), seq(9000, 300)), R1)
    assert caps(plan) == [(484, "guard", None)]  # shares 200 < 256 tokens with entry 1


# -- thinning ------------------------------------------------------------------------


def cks(*specs: str) -> list[Checkpoint]:
    """'g584' -> Checkpoint(584, 'guard')."""
    kinds = {
        "g": "guard",
        "f": "final",
        "d": "divergence",
        "r": "reply",
        "m": "message",
        "s": "system",
    }
    return [Checkpoint(int(s[1:]), kinds[s[0]]) for s in specs]


@pytest.mark.parametrize(
    "checkpoints, live_guard, limit, dropped",
    [
        ("g584 f600 d700 g904 r920", 904, 4, "g584"),
        ("g584 f600 d700 g904 r920", 904, 2, "g584 f600 d700"),
        ("g584 f600 d700 g904 r920", 904, 0, "g584 f600 d700 g904 r920"),
        ("g584 f600 d700 g904 r920", None, 3, "g584 g904"),  # no live guard: both are old
        ("d50 g100 f200 g300 f400 g500 r520", 500, 3, "g100 g300 f200 f400"),
        ("f200 f400 r520", None, 4, ""),
        # a lineage's own long-message points go after its turn boundaries, before the
        # system block's points, which go before divergence points, shortest first
        ("s100 s200 f300 m400 m500 d600 g700 r720", 700, 4, "f300 m400 m500 s100"),
        ("s100 s200 f300 m400 m500 d600 g700 r720", 700, 6, "f300 m400"),
        ("m400 s100 d50 m500", None, 1, "m400 m500 s100"),
    ],
)
def test_thinning_order(checkpoints, live_guard, limit, dropped):
    assert thin(cks(*checkpoints.split()), limit, live_guard) == cks(*dropped.split())


def test_thinning_over_turns_carries_only_the_survivors():
    """Each turn re-renders the reply and adds 300 tokens: a live guard per turn."""
    d = Driver()
    prompt = tokens(P1)
    d.turn(prompt, R1)
    expected = [  # (moves, checkpoints) of turns 2, 3, 4
        (((1, 584, 2), (1, 600, 2)), {584: "guard", 600: "final", 904: "guard", 920: "reply"}),
        (((2, 600, 3), (2, 920, 3)), {600: "final", 920: "final", 1224: "guard", 1240: "reply"}),
        (((3, 920, 4), (3, 1240, 4)), {920: "final", 1240: "final", 1544: "guard", 1560: "reply"}),
    ]
    for turn, (moved, checkpoints) in enumerate(expected, start=2):
        orders = Orders(moves=moves(*moved), free=(turn - 1,))
        prompt = tokens(prompt, seq(20_000 + turn * 1000, 20), seq(40_000 + turn * 1000, 300))
        plan, got = d.turn(prompt, R1)
        assert (plan.kind, plan.length) == ("reply", len(prompt) - 320)
        assert got == orders and d.checkpoints(turn) == checkpoints


def test_thinning_drops_own_checkpoints_by_order():
    d = Driver(max_checkpoints=1)
    _, orders = d.turn(P1, R1)
    assert orders == Orders(drop_checkpoints=((1, 584),)) and d.checkpoints(1) == {600: "reply"}
    d2 = Driver(max_checkpoints=0)
    _, orders = d2.turn(P1, R1)
    assert orders == Orders(drop_checkpoints=((1, 584), (1, 600))) and d2.checkpoints(1) == {}


# -- a request cancelled in prefill ----------------------------------------------------


@pytest.mark.parametrize(
    "upto, checkpoints, retry",
    [
        (590, {584: "guard"}, moves((1, 584, 3), (1, 590, 3))),
        (584, {}, moves((1, 584, 3))),  # cut right at the guard: that state is the entry's own
    ],
)
def test_a_prefill_cancelled_midway_keeps_its_prefix(upto, checkpoints, retry):
    d = Driver()
    plan = d.plan(P1, anchor_len=500)
    assert d.commit(plan.request_id, upto=upto) == Orders()
    assert d.entry(1).length == upto and d.checkpoints(1) == checkpoints
    assert d.entry(2).role == "anchor"
    plan, orders = d.turn(P1, R1, anchor_len=500)  # the retry resumes at the prefix
    assert (plan.entry_id, plan.length, plan.kind) == (1, upto, "entry")
    assert orders == Orders(moves=retry, free=(1,))


# -- a model with no state layers ----------------------------------------------------


def test_pure_attention_restores_anywhere_and_captures_only_anchors():
    d = Driver(state_layers=False)
    plan, _ = d.turn(P1, R1, anchor_len=500)
    assert caps(plan) == [(500, "anchor", 2)]
    plan, orders = d.turn(tokens(seq(1000, 590), seq(7000, 40)), R1, anchor_len=500)
    assert (plan.entry_id, plan.length, plan.kind) == (1, 590, "entry")
    assert orders == Orders()
