"""Random interleaved operation sequences against the cache's invariants (hypothesis).

Plans, restores, commits (with prefill cut short at random) and releases of
overlapping requests run through fakes.Driver, which checks the manager's
invariants and the fake actor's holdings after every call; the fake actor
asserts it is never told to restore, move or drop what it does not hold.
Each plan is also checked against a brute-force oracle of the longest
restore point. Orders travel late at random (the driver's `hold`: a commit's
Orders and a later plan race, as they do between the actors), and a restore
point can go missing at admission (`lose`: the actor asks for a new plan).

Bounded to run in a few seconds. LINEAGE_DEEP_TESTS=1 runs the deep mode:
random seeds and thousands of steps per machine (minutes).
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from engine.cache.messages import PromptLayout
from engine.config import CacheConfig
from tests.fakes import KVPT, STATE, Driver, tokens

# Three system prompts: two differ by 4 tokens near their end, one elsewhere.
SYSTEMS = [
    tokens(range(1000, 1060), [1, 2, 3, 4], range(1064, 1070)),
    tokens(range(1000, 1060), [5, 6, 7, 8], range(1064, 1070)),
    tokens(range(3000, 3050)),
]
CONFIG = dict(
    ram_budget=5 * (150 * KVPT + 3 * STATE),
    anchor_max_entries=2,
    anchor_max_bytes=2 * (70 * KVPT + STATE),
    max_checkpoints=2,
    guard_offset=4,
    guard_min_suffix=24,
    divergence_min_gain=12,
    message_interval=16,  # long-message points inside the drawn messages
    exact_max_entries=5,
)
# Derandomized: CI runs the same sequences every time (a red run is a real bug,
# never a lucky draw). The deep mode explores with random seeds and long runs.
DEEP = os.environ.get("LINEAGE_DEEP_TESTS", "") not in ("", "0")
SETTINGS = settings(
    max_examples=300 if DEEP else 30,
    stateful_step_count=60 if DEEP else 25,
    deadline=None,
    derandomize=not DEEP,
    suppress_health_check=[HealthCheck.too_slow],
)


def scaled(examples: int) -> settings:
    """SETTINGS with `examples` examples in CI (the deep mode keeps its own, 10x as many)."""
    return settings(SETTINGS, max_examples=examples * 10 if DEEP else examples)


def oracle(entries, namespace: str, query: np.ndarray, state_layers: bool) -> int:
    """The longest restore point within `query`, by brute force."""
    best = 0
    for entry in entries:
        if entry.namespace != namespace:
            continue
        lcp = 0
        while lcp < min(entry.length, len(query)) and entry.tokens[lcp] == query[lcp]:
            lcp += 1
        if lcp == entry.length or not state_layers:
            best = max(best, lcp)
        else:
            best = max([best, *(n for n in entry.checkpoints if n <= lcp)])
    return best


def check_waiting(driver, plan, namespace: str, anchor_len: int, expected: int) -> None:
    """A waiting plan restores an anchor another in-flight request of its namespace captures,
    longer than anything stored."""
    assert plan.kind == "anchor" and expected < plan.length == anchor_len, (plan, expected)
    capturers = [
        p
        for p, _, ns in driver._requests.values()
        if ns == namespace and any(c.entry_id == plan.entry_id for c in p.captures)
    ]
    assert capturers, plan


class CacheMachine(RuleBasedStateMachine):
    mode = "lineage"
    state_layers = True

    def __init__(self) -> None:
        super().__init__()
        self.driver = Driver(CacheConfig(mode=self.mode, **CONFIG), state_layers=self.state_layers)
        self.texts: list[np.ndarray] = []  # committed prompts + replies
        self.sent: list[np.ndarray] = []  # committed prompts
        self.prompts: dict[str, np.ndarray] = {}

    @rule(data=st.data())
    def plan(self, data):
        base = data.draw(st.sampled_from(SYSTEMS + self.texts[-6:]))  # recent lineages, mostly
        cut = data.draw(st.just(len(base)) | st.integers(1, len(base)))  # a next turn, or an edit
        self._plan(data, base[:cut])

    @precondition(lambda self: self.texts)
    @rule(data=st.data())
    def plan_siblings(self, data):
        """Two requests from one stored text at once (sub-agents; a regenerate and a next turn)."""
        base = data.draw(st.sampled_from(self.texts[-4:]))
        self._plan(data, base)
        self._plan(data, base[: data.draw(st.integers(1, len(base)))])

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def resend(self, data):
        """A retry: a committed prompt sent again verbatim."""
        self._plan(data, data.draw(st.sampled_from(self.sent[-4:])), tail=False)

    def _plan(self, data, head: np.ndarray, tail: bool = True) -> None:
        suffix = data.draw(st.lists(st.integers(0, 20), min_size=1, max_size=60)) if tail else []
        prompt = tokens(head, suffix)
        anchors = [
            len(s) - 2
            for s in SYSTEMS
            if len(prompt) > len(s) and np.array_equal(prompt[: len(s)], s)
        ]
        anchor_len = data.draw(st.sampled_from([0, *anchors]))
        namespace = data.draw(st.sampled_from(["", "", "", "tenant"]))
        starts = data.draw(st.lists(st.integers(anchor_len, len(prompt)), max_size=6))
        layout = PromptLayout((0, *sorted(starts)), roles=("system",) + ("user",) * len(starts))
        expected = self.expected(namespace, prompt[:-1])
        if self.prompt_end(namespace, prompt):
            expected = len(prompt)  # a verbatim resend restores whole
        plan = self.driver.plan(prompt, anchor_len, namespace, layout=layout)
        lengths = [c.length for c in plan.captures]
        assert lengths == sorted(set(lengths))
        assert all(plan.length < n < len(prompt) for n in lengths)
        if plan.wait:
            check_waiting(self.driver, plan, namespace, anchor_len, expected)
        elif self.mode != "off":
            assert plan.length == expected, (plan, expected)
        self.prompts[plan.request_id] = prompt

    def prompt_end(self, namespace: str, prompt: np.ndarray) -> bool:
        """Whether a RAM entry's prompt end, with its logits, is exactly `prompt`."""
        n = len(prompt)
        return any(
            e.namespace == namespace and e.logits_at == n and np.array_equal(e.tokens[:n], prompt)
            for e in self.driver.manager.index.entries()
        )

    def expected(self, namespace: str, query: np.ndarray) -> int:
        """The oracle's longest restore point for `query` (what is stored in RAM)."""
        needs_state = self.state_layers or self.mode == "exact"  # exact: whole snapshots only
        return oracle(self.driver.manager.index.entries(), namespace, query, needs_state)

    def _pick(self, data) -> str:
        return data.draw(st.sampled_from(sorted(self.prompts)))

    @precondition(lambda self: self.prompts)
    @rule(data=st.data())
    def restore(self, data):
        self.driver.restore(self._pick(data))  # the actor may restore long after the plan

    @precondition(lambda self: self.prompts)
    @rule(data=st.data())
    def commit(self, data):
        request_id = self._pick(data)
        prompt = self.prompts.pop(request_id)
        plan = self.driver.planned(request_id)
        taken = data.draw(st.none() | st.integers(0, 3))
        reply, upto = data.draw(st.lists(st.integers(0, 20), max_size=20)), None
        if plan.length + 1 < len(prompt) - 1 and data.draw(st.booleans()):  # cancelled in prefill
            reply, upto = [], data.draw(st.integers(plan.length + 1, len(prompt) - 1))
            prompt = prompt[:upto]
        self.driver.hold = data.draw(st.booleans())  # its Orders reach the actor late
        self.driver.commit(request_id, reply, taken, upto=upto)
        self.driver.hold = False
        self.texts.append(tokens(prompt, reply))
        self.sent.append(prompt)

    @precondition(lambda self: self.prompts)
    @rule(data=st.data())
    def capture_anchor(self, data):
        """A prefill reaches its anchor before the request ends (AnchorCommit)."""
        self.driver.capture_anchor(self._pick(data))

    @precondition(lambda self: self.driver.in_transit)
    @rule(data=st.data())
    def deliver(self, data):
        """Some Orders in transit reach the actor (plans made meanwhile already did)."""
        self.driver.deliver(data.draw(st.integers(1, len(self.driver.in_transit))))

    @precondition(lambda self: self.prompts)
    @rule(data=st.data())
    def lose(self, data):
        """The actor does not hold a plan's restore point at admission (a fault injected:
        the entry is gone), reports it, and the request is planned again."""
        request_id = self._pick(data)
        plan = self.driver.planned(request_id)
        index = self.driver.manager.index
        others = [r for r, pin in index.pins.items() if r != request_id and pin[0] == plan.entry_id]
        if (
            plan.entry_id not in index
            or others
            or request_id in self.driver._restored
            or self.driver._early.get(request_id)
        ):
            return
        if not self.driver.ready(plan):
            self.driver.deliver()  # the actor admits it only after them
        self.driver.actor.stored.pop(plan.entry_id, None)
        lost_before = self.driver.manager.stats().restores_lost
        new = self.driver.lose(request_id)
        assert self.driver.manager.stats().restores_lost == lost_before + 1
        # Forgotten in RAM; read back from its file when the disk tier holds one.
        assert plan.entry_id not in index or (new.entry_id, new.load_from_disk) == (
            plan.entry_id,
            True,
        )
        assert new.request_id == request_id and new.new_entry_id != plan.new_entry_id

    @precondition(lambda self: self.prompts)
    @rule(data=st.data())
    def release(self, data):
        request_id = self._pick(data)
        del self.prompts[request_id]
        self.driver.release(request_id, taken=data.draw(st.integers(0, 2)))


class ExactMachine(CacheMachine):
    mode = "exact"


class PureAttentionMachine(CacheMachine):
    state_layers = False


class OffMachine(CacheMachine):
    mode = "off"


CacheMachine.TestCase.settings = scaled(50)
ExactMachine.TestCase.settings = scaled(30)
PureAttentionMachine.TestCase.settings = scaled(30)
OffMachine.TestCase.settings = scaled(5)
TestLineage = CacheMachine.TestCase
TestExact = ExactMachine.TestCase
TestPureAttention = PureAttentionMachine.TestCase
TestOff = OffMachine.TestCase
