"""The fault run's checks (clients.bench.faults.checks) on plain values: what counts as leaked,
orphaned or unwritten, and that only a finding that lasts is counted."""

from __future__ import annotations

from clients.bench.faults.checks import Holdings, Lasting, compare
from engine.cache.messages import CacheAudit


def audit(ram=None, holders=None, disk=(), violation="") -> CacheAudit:
    ram = ram or {}
    return CacheAudit(ram, holders or {}, tuple(disk), {}, (), 0, violation)


def test_a_clean_engine_has_no_findings():
    a = audit({1: 100, 2: 50}, {1: (0,), 2: (0, 1)}, disk=(1, 2))
    held = [Holdings(0, {1: 100, 2: 50}, 150, 0), Holdings(1, {2: 50}, 50, 0)]
    assert not compare(a, held, {1, 2})


def test_each_finding():
    a = audit({1: 100}, {1: (0,)}, disk=(1, 3, 4), violation="entry 9 has no holder")
    held = [
        Holdings(0, {1: 90, 7: 30}, 200, 0, writes=(4,), deletes=(5,)),  # 7: nobody placed it
        Holdings(1, {}, 0, 0),
    ]
    found = compare(a, held, {1, 5, 6})  # 5: its delete is queued; 6: nobody indexes it
    assert found.leaked == {(0, 7): 30}
    assert found.miscounted == {(0, 1): (90, 100)}
    assert found.drift == {0: (200, 120)}
    assert list(found.orphans) == [6]
    assert list(found.unwritten) == [3]  # 4 is queued at a writer
    assert found.violation == "entry 9 has no holder"


def test_only_what_lasts_is_counted():
    lasting = Lasting(after=3)
    leak = audit({}, {})
    held = [Holdings(0, {7: 30}, 30, 0)]
    for _ in range(2):
        lasting.see(compare(leak, held, set()))
    lasting.see(compare(audit(), [Holdings(0, {}, 0, 0)], set()))  # freed: it was in flight
    assert lasting.figures()["leaked_bytes"] == 0
    for _ in range(3):
        lasting.see(compare(leak, held, set()))
    assert lasting.figures()["leaked_bytes"] == 30 and lasting.figures()["leaked_entries"] == 1
