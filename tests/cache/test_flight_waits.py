"""Waiting for a request in flight: a prompt sharing a long prefix with one still being
prefilled is told to wait for its commit (RestorePlan.after), then restores its capture.

Token ids are plain ranges (seq), so the longest common prefixes are exact by
construction. Plans are asked with may_wait, as the front end asks them.
"""

from __future__ import annotations

import pytest

from tests.fakes import Driver, tokens


def seq(start: int, n: int) -> range:
    return range(start, start + n)


P = seq(1000, 2000)  # a long first turn, still prefilling when the next one arrives
R = seq(5000, 20)  # its reply
MORE = seq(9000, 300)  # what the extending turn adds


def plan_b(d: Driver, prompt, namespace: str = ""):
    return d.plan(prompt, namespace=namespace, request_id="b", may_wait=True)


def test_an_extending_turn_waits_for_the_flight_and_restores_its_prompt_end():
    d = Driver()
    a = d.plan(P)
    waiting = plan_b(d, tokens(P, MORE))
    assert waiting.after == a.request_id
    assert (waiting.entry_id, waiting.new_entry_id, waiting.captures) == (None, None, ())
    assert "b" not in d.manager.flights and d.manager.counts.flight_waits == 1
    d.commit(a.request_id, R)
    b = plan_b(d, tokens(P, MORE))  # planned again once the flight committed
    assert (b.after, b.entry_id, b.length, b.kind) == ("", a.new_entry_id, 2000, "reply")
    d.commit("b", R)
    assert d.manager.stats().cached_tokens == 2000


def test_a_turn_leaving_the_flight_after_its_guard_waits_for_the_guard():
    d = Driver()
    a = d.plan(P)
    assert [(c.length, c.kind) for c in a.captures] == [(1984, "guard")]
    prompt = tokens(seq(1000, 1990), MORE)  # leaves P at 1990, past its guard
    assert plan_b(d, prompt).after == a.request_id
    d.commit(a.request_id, R)
    b = plan_b(d, prompt)
    assert (b.entry_id, b.length, b.kind) == (a.new_entry_id, 1984, "guard")


@pytest.mark.parametrize(
    "stored, flight, prompt, waits",
    [
        # 255 tokens past the best stored point: under the gain, prefilled beside it
        (seq(1000, 1745), seq(1000, 2000), tokens(seq(1000, 2000), MORE), False),
        (seq(1000, 1744), seq(1000, 2000), tokens(seq(1000, 2000), MORE), True),  # 256
        # the shared part is short
        (None, P, tokens(seq(1000, 200), MORE), False),
        # long shared part, but the flight captures nothing within it (its guard is past)
        (None, P, tokens(seq(1000, 1500), MORE), False),
        # its own prefix is stored longer than the flight reaches
        (tokens(P, R, seq(7000, 400)), P, tokens(P, R, seq(7000, 400), MORE), False),
    ],
)
def test_waits_only_for_a_gain_over_the_best_stored_point(stored, flight, prompt, waits):
    d = Driver()
    if stored is not None:
        d.turn(stored, R)
    a = d.plan(flight)
    assert plan_b(d, prompt).after == (a.request_id if waits else "")


def test_no_wait_unless_the_caller_honours_it():
    d = Driver()
    d.plan(P)
    assert d.plan(tokens(P, MORE), request_id="b").after == ""


def test_namespaces_never_wait_on_each_other():
    d = Driver()
    d.plan(P, namespace="alice")
    b = plan_b(d, tokens(P, MORE), namespace="bob")
    assert (b.after, b.entry_id, b.length) == ("", None, 0)


def test_a_flight_released_without_commit_lets_the_waiter_plan_at_once():
    d = Driver()
    a = d.plan(P)
    assert plan_b(d, tokens(P, MORE)).after == a.request_id
    d.release(a.request_id)  # cancelled before its prompt end
    b = plan_b(d, tokens(P, MORE))
    assert (b.after, b.entry_id, b.length) == ("", None, 0)


def test_a_flight_cut_short_lets_the_waiter_restore_what_it_reached():
    d = Driver()
    a = d.plan(P)
    assert plan_b(d, tokens(P, MORE)).after == a.request_id
    d.commit(a.request_id, upto=1000)  # cancelled in prefill: no prompt end
    b = plan_b(d, tokens(P, MORE))
    assert b.after == "" and b.length < 2000


def test_requests_in_flight_never_wait_on_each_other():
    """A waiter is not in flight, so nothing waits on it: a third turn extending the
    waiter's prompt waits for the same flight, never for the waiter."""
    d = Driver()
    a = d.plan(P)
    assert plan_b(d, tokens(P, MORE)).after == a.request_id
    c = d.plan(tokens(P, MORE, seq(11_000, 300)), request_id="c", may_wait=True)
    assert c.after == a.request_id
    assert set(d.manager.flights) == {a.request_id}
    assert all(not f.plan.after for f in d.manager.flights.values())


def test_parallel_sub_agents_still_wait_on_the_anchor_mid_prefill():
    """The shared part is the anchor: the anchor wait (restored at its capture, mid-prefill)
    serves it, not a wait for the whole flight."""
    d = Driver()
    a = d.plan(tokens(seq(1000, 500), seq(7000, 100)), anchor_len=500)
    b = d.plan(tokens(seq(1000, 500), seq(8000, 100)), 500, request_id="b", may_wait=True)
    assert (b.after, b.wait, b.entry_id, b.length) == ("", True, a.captures[0].entry_id, 500)


def test_without_state_layers_any_shared_row_is_worth_the_wait():
    d = Driver(state_layers=False)
    a = d.plan(P)
    prompt = tokens(seq(1000, 1500), MORE)  # leaves P at 1500: no capture there
    assert plan_b(d, prompt).after == a.request_id
    d.commit(a.request_id, R)
    b = plan_b(d, prompt)
    assert (b.after, b.entry_id, b.length) == ("", a.new_entry_id, 1500)


# -- the flight's prompt end stored early, while it decodes ---------------------------


def test_a_waiter_restores_the_prompt_end_stored_while_the_flight_decodes():
    d = Driver()
    a = d.plan(P)
    waiting = plan_b(d, tokens(P, MORE))
    early = waiting.after_entry
    assert waiting.after == a.request_id and early is not None
    assert plan_b(d, tokens(P, MORE)).after_entry == early  # asked again: the same id
    d.store_prompt_end(a.request_id, early)  # its prefill ended; it decodes on
    b = plan_b(d, tokens(P, MORE))
    assert (b.after, b.entry_id, b.length) == ("", early, 2000)
    assert a.request_id in d.manager.flights  # the flight still runs
    d.commit("b", R)  # absorbs the early entry: its prompt end becomes b's turn boundary
    assert d.entry(early) is None and d.checkpoints(b.new_entry_id)[2000] == "final"
    d.commit(a.request_id, R)  # its own entry, with its reply, beside b's lineage
    assert d.checkpoints(a.new_entry_id) == {1984: "guard", 2000: "reply"}
    assert d.manager.stats().cached_tokens == 2000


def test_the_flights_commit_frees_its_early_prompt_end_once_the_waiter_lets_go():
    d = Driver()
    a = d.plan(P)
    early = plan_b(d, tokens(P, MORE)).after_entry
    d.store_prompt_end(a.request_id, early)
    b = plan_b(d, tokens(P, MORE))
    assert b.entry_id == early
    d.commit(a.request_id, R)  # its entry holds the prompt end now: the early one goes
    assert d.entry(early) is None and early in d.manager.index.deferred  # b still reads it
    assert d.checkpoints(a.new_entry_id)[2000] == "reply"
    d.commit("b", R)
    assert early not in d.manager.index.deferred and early not in d.actor.stored
    c = d.plan(tokens(P, R, seq(7000, 50)))  # the flight's lineage goes on from its entry
    assert (c.entry_id, c.length) == (a.new_entry_id, 2020)


def test_a_flight_released_after_its_early_prompt_end_leaves_it_stored():
    d = Driver()
    a = d.plan(P)
    early = plan_b(d, tokens(P, MORE)).after_entry
    d.store_prompt_end(a.request_id, early)
    d.release(a.request_id)  # cancelled while decoding
    assert d.entry(early) is not None and d.entry(early).length == 2000
    b = plan_b(d, tokens(P, MORE))
    assert (b.after, b.entry_id, b.length) == ("", early, 2000)
    resend = d.plan(P, request_id="c")  # a verbatim resend restores it whole
    assert (resend.entry_id, resend.length) == (early, 2000)


def test_a_prompt_end_stored_after_its_flight_ended_is_freed_at_once():
    d = Driver()
    a = d.plan(P)
    early = plan_b(d, tokens(P, MORE)).after_entry
    d.release(a.request_id)  # its release overtook the early store
    orders = d.store_prompt_end(a.request_id, early, prompt=P)
    assert early in orders.free and early not in d.actor.stored and d.entry(early) is None


def test_no_early_prompt_end_for_a_wait_on_a_capture_point():
    d = Driver()
    a = d.plan(P)
    waiting = plan_b(d, tokens(seq(1000, 1990), MORE))  # leaves P past its guard
    assert (waiting.after, waiting.after_entry) == (a.request_id, None)
    assert d.manager.flights[a.request_id].prompt_end is None


def test_an_early_prompt_end_asked_for_an_earlier_plan_is_freed_at_once():
    """The flight was replanned (its restore point lost) after a waiter asked: the id it was
    asked to store under went back with the old plan."""
    d = Driver()
    d.turn(seq(1000, 1500), R)
    a = d.plan(P)
    early = plan_b(d, tokens(P, MORE)).after_entry
    d.lose(a.request_id)  # its plan, and the early id with it, are given back
    assert d.manager.flights[a.request_id].prompt_end is None
    orders = d.store_prompt_end(a.request_id, early)
    assert early in orders.free and early not in d.actor.stored and d.entry(early) is None


def test_an_early_prompt_end_stored_twice_is_refused():
    d = Driver()
    a = d.plan(P)
    early = plan_b(d, tokens(P, MORE)).after_entry
    d.store_prompt_end(a.request_id, early)
    d.actor.stored.pop(early)  # the actor's second copy would land under the same id
    with pytest.raises(ValueError, match="stored twice"):
        d.store_prompt_end(a.request_id, early)
