"""Miss explanations (engine.cache.misses): where and why a prompt left the earlier one.

Prompts are built here from messages of token ranges with their layout (where each
starts, a digest of what it said), as engine.server.prompts.layout makes them from a chat
template; the tools come first, as the embedded template renders them. Each case
runs earlier turns through the real manager (tests.fakes.Driver), then plans the
new prompt and checks the plan's Miss: kind, token, message.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from engine.cache.kinds import MissKind
from engine.cache.messages import Miss, PromptLayout
from engine.cache.misses import MissLog
from tests.fakes import Driver, entry_bytes, tokens

TOOLS = list(range(500, 600))  # 100 tokens of tools, rendered first
SYS = ("system", list(range(1000, 1300)))
U1 = ("user", list(range(2000, 2100)))
A1 = ("assistant", list(range(3000, 3050)))  # the first reply, as generated
U2 = ("user", list(range(2200, 2300)))
A2 = ("assistant", list(range(3100, 3150)))
U3 = ("user", list(range(2400, 2450)))


def changed(message, at: int, token: int = 9999):
    """The message with one token replaced: the client changed its text."""
    role, toks = message
    return role, toks[:at] + [token] + toks[at + 1 :]


def rerendered(message, at: int):
    """Same text as sent (same digest), other tokens: the template rendered it otherwise."""
    role, toks = message
    return role, toks[:at] + [8888] + toks[at + 1 :], toks


def chat(*messages, tools=TOOLS):
    """(tokens, layout) of a prompt: the tools, then each (role, tokens[, what it said])."""
    parts, starts, digests, roles = [list(tools or ())], [], [], []
    pos = len(tools or ())
    for m in messages:
        role, toks, said = m if len(m) == 3 else (*m, m[1])
        starts.append(pos)
        roles.append(role)
        digests.append(hashlib.sha256(f"{role}{said}".encode()).hexdigest()[:16])
        parts.append(toks)
        pos += len(toks)
    tools_digest = hashlib.sha256(str(tools).encode()).hexdigest()[:16] if tools else ""
    layout = PromptLayout(tuple(starts), tuple(digests), tuple(roles), tools_digest)
    return tokens(*parts), layout


def run(driver: Driver, earlier, new, namespace: str = ""):
    """Commit the earlier (prompt, reply) turns, then plan `new`: its plan."""
    for (prompt, layout), reply in earlier:
        plan = driver.plan(prompt, namespace=namespace, layout=layout)
        driver.commit(plan.request_id, reply=reply[1] if reply else ())
    prompt, layout = new
    return driver.plan(prompt, namespace=namespace, layout=layout)


N_HEAD = len(TOOLS) + len(SYS[1])  # where the first user message starts
TURN1 = (chat(SYS, U1), A1)
TURN2 = (chat(SYS, U1, A1, U2), A2)
CASES = [
    # (id, earlier turns, new prompt, expected (kind, token, message) or None)
    ("a continuation", [TURN1], chat(SYS, U1, A1, U2), None),
    ("a verbatim resend", [TURN1], chat(SYS, U1), None),
    ("a new conversation beside it", [TURN1], chat(SYS, U2), None),
    (
        "the system prompt changed",
        [TURN1],
        chat(changed(SYS, 200), U1, A1, U2),
        (MissKind.SYSTEM, len(TOOLS) + 200, 0),
    ),
    (
        "the tools changed",
        [TURN1],
        chat(SYS, U1, A1, U2, tools=TOOLS[:50] + [7] + TOOLS[51:]),
        (MissKind.TOOLS, 50, -1),
    ),
    (
        "a past message edited",
        [TURN1, TURN2],
        chat(SYS, U1, A1, changed(U2, 10), A2, U3),
        (MissKind.HISTORY, N_HEAD + 100 + 50 + 10, 3),
    ),
    (
        "a past message rendered otherwise",
        [TURN1, TURN2],
        chat(SYS, U1, rerendered(A1, 5), U2, A2, U3),
        (MissKind.TEMPLATE, N_HEAD + 100 + 5, 2),
    ),
    (
        "the reply sent back otherwise than generated",
        [TURN1],
        chat(SYS, U1, changed(A1, 20), U2),
        (MissKind.TEMPLATE, N_HEAD + 100 + 20, 2),
    ),
    (
        "the reply dropped for another message",
        [TURN1],
        chat(SYS, U1, U2),
        (MissKind.HISTORY, N_HEAD + 100, 2),
    ),
    ("a prefix of an earlier prompt", [TURN2], chat(SYS, U1, A1), None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_plan_says_where_and_why_it_missed(case):
    _, earlier, new, expected = case
    d = Driver()
    plan = run(d, earlier, new)
    got = None if plan.miss is None else (plan.miss.kind, plan.miss.token, plan.miss.message)
    assert got == expected
    counts = d.manager.stats().misses
    assert counts == ({} if expected is None else {str(expected[0]): 1})


def test_a_continuation_whose_entry_was_evicted_is_evicted():
    first = chat(SYS, U1)
    # Room for about one conversation: another namespace's long one evicts this one's.
    d = Driver(ram_budget=entry_bytes(len(first[0]) + 50, 2) + entry_bytes(1000, 1) // 2)
    run(d, [(first, A1)], chat(SYS, U1, A1, U2))  # warm: no miss
    other = run(d, [], chat(("system", list(range(50_000, 51_000)))), namespace="other")
    assert other.miss is None  # this namespace's prompts say nothing about another's
    d.commit(other.request_id)
    assert d.manager.stats().evictions >= 1
    again = run(d, [], chat(SYS, U1, A1, U2))
    assert again.length == 0
    # It could have restored its first 550 tokens: up to where its message 3 begins.
    assert again.miss == Miss(MissKind.EVICTED, len(first[0]) + 50, 3, len(first[0]) + 50)
    assert str(again.miss) == "evicted@550/m3"


def test_raw_tokens_are_explained_only_when_evicted():
    log = MissLog()
    log.record("", tokens(range(100)), PromptLayout())
    stored = lambda: 0  # noqa: E731
    assert log.explain("", tokens(range(50), [7], range(51, 80)), PromptLayout(), 0, stored) is None
    miss = log.explain("", tokens(range(120)), PromptLayout(), 10, stored)
    assert miss == Miss(MissKind.EVICTED, 100, -1, 100) and str(miss) == "evicted@100/head"
    assert log.explain("", tokens(range(120)), PromptLayout(), 10, lambda: 100) is None


def test_the_log_is_bounded_and_a_turn_replaces_the_one_it_extends():
    log = MissLog(per_namespace=2, max_tokens=250)
    log.record("a", tokens(range(50)), PromptLayout())
    log.record("a", tokens(range(80)), PromptLayout())  # extends the first: replaces it
    assert [len(r.tokens) for r in log.by_namespace["a"].values()] == [80]
    log.record("a", tokens(range(1000, 1060)), PromptLayout())
    log.record("a", tokens(range(2000, 2070)), PromptLayout())  # over per_namespace: 80 goes
    assert [len(r.tokens) for r in log.by_namespace["a"].values()] == [60, 70]
    log.record("b", tokens(range(3000, 3150)), PromptLayout())  # over max_tokens: oldest go
    log.check()
    assert log.tokens <= 250 and "b" in log.by_namespace
    assert np.array_equal(
        log.closest("b", tokens(range(3000, 3010))).tokens[:3], [3000, 3001, 3002]
    )
