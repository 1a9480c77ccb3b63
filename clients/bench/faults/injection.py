"""The faults `lineage bench faults` injects into a live engine, and how it tells they are over.

Each fault is done to the real processes: a SIGKILL of an actor's process (Ray
restarts it), a model loop put to sleep past its deadline, a disk writer that
meets ENOSPC (the write call fails as on a full disk; the real disk is never
filled, the machine is shared). `Injector` runs them one after another on a
thread of its own, `--gap` seconds apart, and after each one waits until the
engine serves again and the fault left its mark:

- manager: another process answers as the manager, a new epoch is up;
- replica: another process answers as replica 1, the supervisor revived it;
- stall: the supervisor reset replica 0 (a restart counted) without killing it;
- disk: lost writes were reported while the disk was "full", and a file was
  written after (it sends requests of its own until one is: the traffic may be
  over by then).

The functions sent to an actor (`_stall`, `_disk_full`) run there through
`__ray_call__`; they import nothing the client process lacks.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

import numpy as np


def _stall(actor, seconds: float) -> None:
    """On a model actor: its loop thread sleeps `seconds` before its next step."""
    actor.loop.call(lambda g: time.sleep(seconds))


def _disk_full(actor, seconds: float) -> None:
    """On a model actor: its disk writer's writes fail with ENOSPC for `seconds`."""
    from engine.storage import writer

    real, until = writer.write_file, time.monotonic() + seconds

    def full(directory, job):
        if time.monotonic() < until:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        writer.write_file = real
        return real(directory, job)

    writer.write_file = full


def _writer_figures(actor) -> dict:
    """On a model actor: its disk writer's counters (files written, writes given up)."""
    g = actor.loop.generator
    disk = g.tier.disk_tier if g is not None else None
    return disk.writer.stats.as_dict() if disk is not None else {}


class Injector(threading.Thread):
    """Injects `faults` in order and records, for each, whether and when it was survived."""

    def __init__(self, engine, client, faults: list[str], args) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.engine, self.client, self.faults, self.args = engine, client, faults, args
        self.results: list[dict] = []
        self.done = threading.Event()
        self._probes = 0

    def run(self) -> None:
        try:
            for name in self.faults:
                time.sleep(self.args.gap)
                t0 = time.monotonic()
                survived, mark = getattr(self, f"_{name}")(t0 + self.args.recovery)
                self.results.append(
                    {
                        "fault": name,
                        "survived": survived,
                        "recovery_s": time.monotonic() - t0,
                        "mark": mark if survived else "",
                        "why": "" if survived else mark,
                    }
                )
        finally:
            self.done.set()

    # ---- the faults ---------------------------------------------------------------

    def _manager(self, deadline: float) -> tuple[bool, str]:
        manager, sup = self.engine.engine.manager, self.engine.engine.supervisor
        pid, epoch = self._pid(manager), sup.manager_epoch
        os.kill(pid, signal.SIGKILL)
        ok = self._until(deadline, lambda: self._pid(manager) not in (None, pid))
        ok = ok and self._until(deadline, lambda: sup.manager_epoch > epoch and sup.ready.is_set())
        if not (ok and self._served(deadline)):
            return False, "the manager did not come back and serve"
        return True, f"manager pid {pid} -> {self._pid(manager)}, epoch {sup.manager_epoch}"

    def _replica(self, deadline: float) -> tuple[bool, str]:
        model, sup = self.engine.engine.replicas[-1], self.engine.engine.supervisor
        pid, restarts = self._pid(model), sup.restarts
        os.kill(pid, signal.SIGKILL)
        ok = self._until(deadline, lambda: self._pid(model) not in (None, pid))
        ok = ok and self._until(deadline, lambda: sup.restarts > restarts and self._all_alive())
        if not (ok and self._served(deadline)):
            return False, "the replica did not come back and serve"
        last = len(self.engine.engine.replicas) - 1
        return True, f"replica {last} pid {pid} -> {self._pid(model)}"

    def _stall(self, deadline: float) -> tuple[bool, str]:
        import ray

        model, sup = self.engine.engine.replicas[0], self.engine.engine.supervisor
        restarts, wedged = sup.restarts, sup.wedged_restarts
        seconds = 1.5 * self.args.loop_deadline
        ray.get(model.__ray_call__.remote(_stall, seconds), timeout=30)
        ok = self._until(deadline, lambda: sup.restarts > restarts and self._all_alive())
        if not (ok and self._served(deadline)):
            return False, "the stalled replica was not reset and routed to again"
        if sup.wedged_restarts != wedged:
            return False, "the stalled replica was killed as wedged (two missed pings)"
        return True, f"replica 0 stalled {seconds:.1f} s, missed a ping, was reset (not killed)"

    def _disk(self, deadline: float) -> tuple[bool, str]:
        import ray

        replicas = self.engine.engine.replicas
        lost = self.client.cache_stats().get("disk_writes_lost", 0)
        seconds = self.args.disk_full
        ray.get([m.__ray_call__.remote(_disk_full, seconds) for m in replicas], timeout=30)
        full_until = time.monotonic() + seconds
        while time.monotonic() < full_until - 0.5:  # writes come due meanwhile: lost
            self._served(deadline)
            time.sleep(0.5)
        time.sleep(max(0.0, full_until - time.monotonic()) + 1.0)
        written = self._files_written()
        ok = self._until(
            deadline, lambda: self.client.cache_stats().get("disk_writes_lost", 0) > lost
        )
        if not ok:
            return False, "no write was lost (and reported) while the disk was full"
        # Requests of its own until a file is written: the traffic may be over, and the
        # writer gives up writes for a while after a full disk.
        if not self._until(deadline, lambda: self._served(deadline) and self._written(written)):
            return False, "no file was written after the disk had room again"
        now = self.client.cache_stats().get("disk_writes_lost", 0)
        return True, f"{now - lost} writes lost and reported, files written after"

    def _written(self, before: int) -> bool:
        """More files written than `before`, waiting a little for the writers."""
        return self._until(time.monotonic() + 2.0, lambda: self._files_written() > before)

    # ---- what they wait for -------------------------------------------------------

    def _pid(self, actor) -> int | None:
        import ray

        try:
            return ray.get(actor.hello.remote(), timeout=5).pid
        except Exception:
            return None

    def _all_alive(self) -> bool:
        try:
            return all(r["alive"] for r in self.client.cache_stats()["replicas"])
        except Exception:
            return False

    def _files_written(self) -> int:
        import ray

        total = 0
        for m in self.engine.engine.replicas:
            try:
                total += ray.get(m.__ray_call__.remote(_writer_figures), timeout=5).get("files", 0)
            except Exception:
                pass
        return total

    def _served(self, deadline: float) -> bool:
        """A small request of its own (a namespace nobody else uses) served before `deadline`."""
        from clients.client import LineageError

        while time.monotonic() < deadline:
            self._probes += 1
            ids = np.random.default_rng(self._probes).integers(20, 3000, 40).tolist()
            try:
                self.client.generate(prompt_ids=ids, max_tokens=2, namespace="fault-probe")
                return True
            except LineageError:
                time.sleep(0.5)
        return False

    @staticmethod
    def _until(deadline: float, done) -> bool:
        while time.monotonic() < deadline:
            try:
                if done():
                    return True
            except Exception:
                pass
            time.sleep(0.25)
        return False
