"""Long-message points: where they fall, what an edit inside a long message restores, thinning.

Token ids are plain ranges (seq(a, n)), so common prefixes are exact by
construction. A conversation here is a (system + tools) block of 500 tokens
(the anchor), then messages given as token spans; a message's span runs from
its start to the next one's (PromptLayout.spans of the starts the front end
finds, PlanRequest.layout).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache.message_points import MESSAGE_SLICES, SYSTEM_SLICES, message_points, spacing
from engine.cache.messages import PlanRequest, PromptLayout
from tests.fakes import Driver, tokens


def seq(start: int, n: int) -> range:
    return range(start, start + n)


def caps(plan) -> list[tuple]:
    return [(c.length, c.kind, c.entry_id) for c in plan.captures]


R1 = seq(5000, 20)  # a reply


def layout(*spans) -> PromptLayout:
    """The layout of a system message at 0, then a message at each span's start and
    one at each span's end (the template's tail or the next message)."""
    starts = sorted({0, *(n for span in spans for n in span)})
    return PromptLayout(tuple(starts), roles=("system",) + ("user",) * (len(starts) - 1))


# -- placement -------------------------------------------------------------------


@pytest.mark.parametrize(
    "spans, interval, most, restored, size, points",
    [
        # every `interval` tokens from each span's own start, strictly inside it
        ([(510, 3510)], 1024, 4, 0, 3530, [1534, 2558]),
        ([(900, 3900)], 1024, 4, 0, 3920, [1924, 2948]),  # moved with its message
        ([(510, 1534)], 1024, 4, 0, 3000, []),  # its end is no point inside it
        ([(510, 1535)], 1024, 4, 0, 3000, [1534]),
        ([(510, 1400)], 1024, 4, 0, 3000, []),  # a short message holds none
        # only what this prefill computes: past the restore point, before the prompt end
        ([(510, 3510)], 1024, 4, 1534, 3530, [2558]),
        ([(510, 3510)], 1024, 4, 1533, 3530, [1534, 2558]),
        ([(510, 3510)], 1024, 4, 0, 2558, [1534]),
        # several messages, the longest `most` of all their points
        ([(0, 5000), (5100, 8200)], 2048, 4, 0, 8300, [2048, 4096, 7148]),
        ([(0, 5000), (5100, 8200)], 1024, 3, 0, 8300, [6124, 7148, 8172]),
        # each span with its own spacing: the system block's wider than a message's
        (
            [(0, 5000, 2048), (5100, 8200, 512)],
            None,
            6,
            0,
            8300,
            [5612, 6124, 6636, 7148, 7660, 8172],
        ),
        (
            [(0, 5000, 2048), (5100, 8200, 512)],
            None,
            8,
            0,
            8300,
            [2048, 4096, 5612, 6124, 6636, 7148, 7660, 8172],
        ),
        ([(0, 5000, 2048), (5100, 8200, 512)], None, 8, 7000, 8300, [7148, 7660, 8172]),
        ([(0, 9000)], 1000, 4, 0, 9100, [5000, 6000, 7000, 8000]),
        ([(0, 9000)], 0, 4, 0, 9100, []),  # interval 0: none
        ([(0, 9000)], 1000, 0, 0, 9100, []),
        ([], 1024, 4, 0, 9100, []),
    ],
)
def test_points_fall_every_interval_from_each_messages_start(
    spans, interval, most, restored, size, points
):
    spans = [s if interval is None else (*s, interval) for s in spans]
    assert message_points(spans, most, restored, size) == points


@pytest.mark.parametrize(
    "length, floor, slices, expected",
    [
        (2160, 256, MESSAGE_SLICES, 270),  # a message: an eighth of it
        (5225, 512, MESSAGE_SLICES, 654),
        (2047, 512, MESSAGE_SLICES, 512),  # never below the floor
        (300, 512, MESSAGE_SLICES, 512),
        (100_000, 512, MESSAGE_SLICES, 12_500),
        (6900, 2048, SYSTEM_SLICES, 2300),  # the system block: a third of it
        (5000, 2048, SYSTEM_SLICES, 2048),
        (5000, 0, MESSAGE_SLICES, 0),  # floor 0: no points
    ],
)
def test_the_spacing_is_a_fraction_of_the_span_above_a_floor(length, floor, slices, expected):
    assert spacing(length, floor, slices) == expected


# -- a long message in a conversation -----------------------------------------------

SYSTEM = seq(1000, 500)  # the (system + tools) block: the anchor
PASTE = (510, 3510)  # a user message pasting a 3000-token file, after a 10-token header
TURN = tokens(seq(1000, 3530))  # the block, the message, 20 tokens of template


@pytest.mark.parametrize(
    "spans, captures, checkpoints",
    [
        (
            (PASTE,),
            [(500, "anchor", 2), (1534, "message", None), (2558, "message", None)],
            {1534: "message", 2558: "message", 3514: "guard", 3530: "reply"},
        ),
        # where the front end located no message, only the system block holds points
        ((), [(500, "anchor", 2)], {3514: "guard", 3530: "reply"}),
    ],
)
def test_a_long_message_gets_points_relative_to_its_start(spans, captures, checkpoints):
    d = Driver(message_interval=1024)
    plan, _ = d.turn(TURN, R1, anchor_len=500, layout=layout(*spans))
    assert caps(plan) == captures + [(3514, "guard", None)]
    assert d.checkpoints(1) == checkpoints


@pytest.mark.parametrize(
    "edit, spans, restore, captures",
    [
        # a line edited near the message's end: restores at the last point before it
        (3300, (PASTE,), (1, 2558, "message"), [(3300, "divergence"), (3514, "guard")]),
        (2600, (PASTE,), (1, 2558, "message"), [(3514, "guard")]),  # the gain is < 256
        (
            2000,
            (PASTE,),
            (1, 1534, "message"),
            [(2000, "divergence"), (2558, "message"), (3514, "guard")],
        ),
        # without the message's span: back to the anchor, before the whole message
        (3300, (), (2, 500, "anchor"), [(3300, "divergence"), (3514, "guard")]),
    ],
)
def test_an_edit_inside_a_long_message_restores_at_the_last_point_before_it(
    edit, spans, restore, captures
):
    d = Driver(message_interval=1024)
    d.turn(TURN, R1, anchor_len=500, layout=layout(*spans))
    edited = tokens(seq(1000, edit), seq(9000, 3530 - edit))
    plan, orders = d.turn(edited, R1, anchor_len=500, layout=layout(*spans))
    assert (plan.entry_id, plan.length, plan.kind) == restore
    assert [c[:2] for c in caps(plan)] == captures
    assert not orders.free, "restored before the prompt end: the first lineage stays"


# -- a long tool result in a later turn: thinning ------------------------------------------

P1 = seq(1000, 600)  # system block (500) + a short user message
TOOL = (630, 3630)  # after P1, R1 and a 10-token header: a 3000-token tool result
TURN2 = tokens(P1, R1, seq(20000, 3010), seq(30000, 20))


def test_points_in_a_later_turn_outlive_the_turn_boundaries_and_not_the_guard():
    """At most 4 per lineage: the old guard first, then the carried turn boundaries
    (final), then the long-message points; the live guard and the prompt end stay."""
    d = Driver(message_interval=1024)
    d.turn(P1, R1, anchor_len=500)
    assert d.checkpoints(1) == {584: "guard", 600: "reply"}
    plan, orders = d.turn(TURN2, seq(6000, 20), anchor_len=500, layout=layout(TOOL))
    assert (plan.entry_id, plan.length, plan.kind) == (1, 620, "entry")
    assert caps(plan) == [(1654, "message", None), (2678, "message", None), (3634, "guard", None)]
    assert d.checkpoints(3) == {1654: "message", 2678: "message", 3634: "guard", 3650: "reply"}
    # the source's guard and both turn boundaries were dropped, not moved
    assert orders.moves == () and orders.free == (1,)
    # the next turn truncates the tool result at 2/3 (an agent trimming its context)
    truncated = tokens(P1, R1, seq(20000, 2010), seq(40000, 60))
    plan, _ = d.turn(truncated, seq(7000, 20), anchor_len=500, layout=layout((630, 2640)))
    assert (plan.entry_id, plan.length, plan.kind) == (3, 1654, "message")


def test_a_variant_deep_inside_a_long_system_prompt_restores_at_the_last_system_point():
    """A 7200-token system block gets points a third of it apart, at 2400 and 4800; a variant
    that changes one token at 3600 restores 2400 of them instead of nothing."""
    d = Driver()
    system = tokens(seq(10_000, 7200))
    plan, _ = d.turn(tokens(system, seq(7000, 100)), R1, anchor_len=7200)
    assert caps(plan)[:3] == [(2400, "system", None), (4800, "system", None), (7200, "anchor", 2)]
    assert d.checkpoints(1) == {2400: "system", 4800: "system", 7284: "guard", 7300: "reply"}
    variant = system.copy()
    variant[3600] = 1
    other = d.plan(tokens(variant, seq(8000, 100)), anchor_len=7200)
    assert (other.entry_id, other.length, other.kind) == (1, 2400, "system")
    kinds = [c[:2] for c in caps(other)][:3]
    assert kinds == [(3600, "divergence"), (4800, "system"), (7200, "anchor")]
    d.commit(other.request_id, R1)


def test_the_default_spacing_of_a_message_and_of_the_system_block():
    """An eighth of a message (at least message_interval, 256) inside it, a third of the
    system block (at least system_interval, 2048) inside that; the system block's are
    captured first (thinning keeps them longer), then the longest of the message's,
    message_max (4) in all; a next session restoring the anchor keeps its message's."""
    d = Driver()
    system = tokens(seq(10_000, 7200))
    prompt = tokens(system, seq(20_000, 4800), seq(7000, 40))  # a 4800-token message at 7200
    plan, _ = d.turn(prompt, R1, anchor_len=7200, layout=layout((7200, 12_000)))
    points = [c[:2] for c in caps(plan) if c[1] in ("system", "message")]
    assert points == [(2400, "system"), (4800, "system"), (10_800, "message"), (11_400, "message")]
    # the lineage that prefilled the system block keeps its points over its own message's
    assert d.checkpoints(1) == {2400: "system", 4800: "system", 12_024: "guard", 12_040: "reply"}
    paste = tokens(system, seq(40_000, 4800), seq(7000, 40))
    plan, _ = d.turn(paste, R1, anchor_len=7200, layout=layout((7200, 12_000)))
    assert (plan.length, plan.kind) == (7200, "anchor")
    assert d.checkpoints(3) == {
        10_800: "message",
        11_400: "message",
        12_024: "guard",
        12_040: "reply",
    }
    short = tokens(system, seq(30_000, 350))  # a 250-token message, under the floor: none
    plan, _ = d.turn(short, R1, anchor_len=7200, layout=layout((7200, 7450)))
    assert (plan.length, plan.kind) == (7200, "anchor") and caps(plan) == [(7534, "guard", None)]


def test_no_points_on_a_model_without_state_layers():
    d = Driver(state_layers=False)
    plan, _ = d.turn(TURN, R1, anchor_len=500, layout=layout(PASTE))
    assert caps(plan) == [(500, "anchor", 2)]


# -- the spans of a layout, and bad starts ------------------------------------------------


@pytest.mark.parametrize(
    "starts, roles, size, spans",
    [
        # each message after the leading system messages, to the next one's start
        ((0, 500, 3510), ("system", "user", "assistant"), 3530, ((500, 3510), (3510, 3530))),
        ((0, 300, 500), ("system", "system", "user"), 900, ((500, 900),)),
        ((0, 500, 500, 700), ("system", "user", "user", "tool"), 900, ((500, 700), (700, 900))),
        ((0, 500), ("user", "assistant"), 900, ((0, 500), (500, 900))),  # no system message
        ((0,), ("system",), 900, ()),
        ((), (), 900, ()),  # raw tokens: no messages
    ],
)
def test_a_layout_spans_each_message_after_the_system_block(starts, roles, size, spans):
    assert PromptLayout(starts, roles=roles).spans(size) == spans


@pytest.mark.parametrize(
    "starts, message",
    [
        ((0, 600, 500), r"layout.starts\[2\] is 500: message starts must be ascending"),
        ((-1, 500), r"layout.starts\[0\] is -1"),
        ((0, 3531), r"layout.starts\[1\] is 3531: .* within \[0, 3530\]"),
        ((0, "510"), r"layout.starts\[1\] is '510'"),
        ((0, 1.5), r"layout.starts\[1\] is 1.5"),
    ],
)
def test_bad_starts_are_refused_naming_the_field(starts, message):
    d = Driver()
    bad = PromptLayout(starts, roles=("system",) + ("user",) * (len(starts) - 1))
    request = PlanRequest("bad", np.asarray(TURN, np.int32), 500, layout=bad)
    with pytest.raises(ValueError, match=message):
        d.manager.plan(request)
    d.turn(TURN, R1, anchor_len=500, layout=layout(PASTE))  # and the manager keeps serving


# -- a client's cache_control breakpoint ---------------------------------------------


def test_a_marked_message_end_is_a_capture_point_and_an_edit_after_it_restores_there():
    """A message the client marked (Anthropic's cache_control: PromptLayout.marks) ends
    where no point of the engine's own falls: its end is captured, within message_max, and
    a prompt that changes after it restores there instead of at the anchor."""
    roles = ("system", "user", "assistant", "user")
    marked = PromptLayout((0, 500, 800, 1100), roles=roles, marks=(1,))
    d = Driver(message_interval=1024)  # no point of its own inside these messages
    plan, _ = d.turn(tokens(seq(1000, 1200)), R1, anchor_len=500, layout=marked)
    assert caps(plan) == [(500, "anchor", 2), (800, "message", None), (1184, "guard", None)]
    edited = tokens(seq(1000, 900), seq(9000, 300))
    again = d.plan(edited, anchor_len=500, layout=marked)
    assert (again.length, again.kind) == (800, "message")
    # a mark inside the anchor is the anchor's; the last message's end is the prompt's own
    inside = PromptLayout((0, 300, 500, 1100), roles=("system",) * 2 + ("user",) * 2, marks=(0, 3))
    assert inside.marked(1200) == (300, 1200)
    fresh = Driver(message_interval=1024)
    plan, _ = fresh.turn(tokens(seq(1000, 1200)), R1, anchor_len=500, layout=inside)
    assert caps(plan) == [(500, "anchor", 2), (1184, "guard", None)]
    # the budget holds: message_max 0 takes none
    none = Driver(message_interval=1024, message_max=0)
    plan, _ = none.turn(tokens(seq(1000, 1200)), R1, anchor_len=500, layout=marked)
    assert caps(plan) == [(500, "anchor", 2), (1184, "guard", None)]
