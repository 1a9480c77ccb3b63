"""Random operation sequences with the disk tier on, restarts included (hypothesis).

The machine of test_cache_properties, driven through fakes.DiskDriver (real
entry files in a temporary directory, a small disk budget), plus a restart
rule: a new manager and an empty model actor on the same directory. After
every call the driver checks that the files of this model are exactly the
disk index's; each plan is checked against a brute-force oracle over both
tiers.
"""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
from hypothesis.stateful import precondition, rule, run_state_machine_as_test

from engine.cache.disk_index import DISK_MIN_TOKENS, HEADER_BYTES
from engine.config import CacheConfig
from tests.cache.test_cache_properties import CONFIG, CacheMachine, oracle, scaled
from tests.fakes import KVPT, STATE, DiskDriver

DISK_BUDGET = 6 * (150 * KVPT + 3 * STATE + 4 * 150 + HEADER_BYTES)
STATS = {"examples": 0, "restarts": 0, "loads": 0, "lost": 0}  # what the runs exercised


def both_tiers(manager, namespace: str, query: np.ndarray) -> int:
    """The longest restore point in RAM, or in a file that shares DISK_MIN_TOKENS tokens."""
    ram = manager.index.entries()
    best = oracle(ram, namespace, query, True)
    held = {e.id for e in ram} | set(manager.index.deferred)
    n = DISK_MIN_TOKENS
    for f in manager.disk_index.files.values():
        entry = f.entry
        if entry is None or entry.id in held or entry.length < n or len(query) < n:
            continue
        if np.array_equal(entry.tokens[:n], query[:n]):
            best = max(best, oracle([entry], namespace, query, True))
    return best


class DiskMachine(CacheMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="lineage-disk-")
        self.config = CacheConfig(disk_budget=DISK_BUDGET, **CONFIG)
        self.driver = DiskDriver(self.directory, self.config)
        self.driver.actor.logits_bytes = 4096  # RAM only: a file's entry has none
        self.restarts = self.loads = self.lost = 0

    def teardown(self) -> None:
        STATS["examples"] += 1
        STATS["restarts"] += self.restarts
        STATS["loads"] += self.loads + self.driver.actor.loads
        STATS["lost"] += self.lost + self.driver.manager.stats().restores_lost
        self.driver.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def expected(self, namespace: str, query: np.ndarray) -> int:
        """The oracle over both tiers: RAM entries and the files on disk."""
        return both_tiers(self.driver.manager, namespace, query)

    @precondition(lambda self: len(self.texts) >= 2 and self.restarts < 2)
    @rule()
    def restart(self):
        """The server stops (requests in flight die with it) and starts again on the same files."""
        disk_entries = self.driver.manager.stats().disk_entries
        self.prompts.clear()
        self.driver.deliver()  # the actor applies what it got before it stops
        self.driver.hold = False
        self.restarts += 1
        self.loads += self.driver.actor.loads
        self.lost += self.driver.manager.stats().restores_lost
        self.driver.close()
        self.driver = DiskDriver(self.directory, self.config)
        self.driver.actor.logits_bytes = 4096
        assert self.driver.manager.stats().disk_entries == disk_entries
        self.driver.check()


def test_disk_sequences_keep_the_invariants_and_exercise_restarts_and_loads():
    """The machine's runs, then what they exercised: restarts and file loads (lost restores
    vary from run to run; tests/cache/test_restore_order.py covers them case by case)."""
    STATS.update(examples=0, restarts=0, loads=0, lost=0)
    run_state_machine_as_test(DiskMachine, settings=scaled(40))
    assert STATS["examples"] >= 10, STATS
    assert STATS["restarts"] > 0 and STATS["loads"] > 0, STATS
