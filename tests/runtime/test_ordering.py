"""The ordering protocol with the cache manager (engine.runtime.ordering.OrderLedger), pure.

Calls go to a real CacheManager through tests/fakes/driver.py's HeldLink, whose
answers travel late and, here, out of order; Orders numbered for another
replica never arrive. A plan waits while Orders before it may be on their
way, and never for a number that went elsewhere. The Generator and the
policy tests' Driver run this same class.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cache import CacheManager
from engine.cache.messages import LostRestore, Orders, PlanRequest, Release
from engine.config import CacheConfig
from engine.runtime.ordering import OrderLedger
from tests.fakes import HeldLink, tokens

ROOT = Path(__file__).resolve().parents[2]


def held() -> tuple[OrderLedger, HeldLink, list]:
    """A ledger over a held link to a fresh manager, and the list its answers reach."""
    link = HeldLink(CacheManager(CacheConfig(), fingerprint="fake", has_state_layers=True))
    link.hold = True
    return OrderLedger(link), link, []


def release(ledger: OrderLedger, link: HeldLink, answers: list, rid: str) -> int:
    """Plan a request and release it through the ledger: the seq of its Orders (in transit)."""
    link.manager.plan(PlanRequest(rid, tokens(range(100, 200))))
    ledger.release(Release(rid), answers.append)
    return link.last.seq


def elsewhere(link: HeldLink) -> int:
    """Orders the manager numbers for another replica: this one never sees them."""
    return link.manager.room("another replica's request").seq


@pytest.mark.parametrize(
    "arrival, applied_after_each",
    [
        ([0, 0], [1, 2]),  # in order
        ([1, 0], [0, 2]),  # the second overtakes the first: 2 waits for the gap below it
    ],
)
def test_applied_counts_up_to_the_first_gap(arrival, applied_after_each):
    ledger, link, answers = held()
    seqs = [release(ledger, link, answers, f"r{k}") for k in range(2)]
    assert seqs == [1, 2] and ledger.unanswered == 2
    assert ledger.behind(1) and ledger.behind(2) and not ledger.behind(0)
    for index, applied in zip(arrival, applied_after_each):
        link.overtake(index)
        assert ledger.applied == applied
    assert ledger.unanswered == 0 and not ledger.behind(2)
    assert sorted(o.seq for o in answers) == [1, 2], "every answer reached its callback"


def test_a_number_that_went_to_another_replica_blocks_nothing():
    ledger, link, answers = held()
    assert elsewhere(link) == 1
    assert release(ledger, link, answers, "r1") == 2
    assert ledger.behind(2), "the answer to our call is on its way"
    link.deliver()
    # Nothing unanswered: 1 will not come here, so everything seen counts as applied.
    assert ledger.applied == 2
    assert release(ledger, link, answers, "r2") == 3
    assert not ledger.behind(2), "a plan after 2 would wait for the gap at 1 forever"
    assert ledger.behind(3)


def test_orders_sent_unasked_are_numbered_not_counted_as_answers():
    ledger, link, answers = held()
    foreign = elsewhere(link)
    mine = release(ledger, link, answers, "r1")
    ledger.received(Orders(seq=foreign))  # another replica's call freed an entry held here
    assert (ledger.applied, ledger.unanswered) == (1, 1)
    assert ledger.behind(mine)
    link.deliver()
    assert (ledger.applied, ledger.unanswered) == (2, 0)


def test_a_replan_is_a_call_and_its_answer_numbers_its_orders():
    ledger, link, answers = held()
    replans = []
    ledger.replan(LostRestore("not in flight", 1, 10), replans.append)
    assert ledger.unanswered == 1 and not replans
    link.deliver()
    assert replans and replans[0].plan is None
    assert (ledger.applied, ledger.unanswered) == (replans[0].orders.seq, 0)


def test_answers_to_calls_sent_before_a_reset_count_for_nothing():
    ledger, link, answers = held()
    release(ledger, link, answers, "r1")
    ledger.reset()  # the manager restarted: it numbers anew
    release(ledger, link, answers, "r2")  # a call of the new epoch
    link.overtake(0)  # the old answer: it still reaches its callback
    assert len(answers) == 1 and ledger.unanswered == 1 and ledger.applied == 0
    link.deliver()
    assert ledger.unanswered == 0


def test_the_protocol_imports_without_mlx_or_ray():
    script = (
        "import sys\n"
        "class Blocked:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('mlx', 'mlx_lm', 'ray', 'grpc'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Blocked())\n"
        "import engine.runtime.ordering, engine.runtime.admission\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'ray')]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
