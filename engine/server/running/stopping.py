"""Stopping within a deadline, whatever died first: blocking calls off the loop, bounded.

Ray's calls block while its raylet or GCS is gone (`ray.get_actor`, `ray.kill`,
`ray.shutdown`): under `timeout`, or Ctrl-C in a terminal, the whole process
group is signalled and Ray's processes may die before the engine stops. So
every such call during a stop runs on a daemon thread of its own, waited for
with a timeout: on a deadline the thread is left behind, and it can neither
block the event loop nor hold the interpreter's exit (the default executor's
threads are joined at exit; these are not). `end_process` is the last step
when one was left: Ray's own exit hook would wait for Ray again, so the
process ends at once, its output flushed (Ray's processes die with it: it
starts them to die with their parent on Linux).

It knows threads, Ray's blocking calls and the actors' names; nothing of what
the actors do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from typing import Sequence

import ray

log = logging.getLogger("lineage")


def off_loop(fn, *args) -> asyncio.Future:
    """`fn(*args)` on a daemon thread of its own, as a future of the running loop: wait for
    it with a timeout, and the thread is left behind when it passes."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        result, error = None, None
        try:
            result = fn(*args)
        except Exception as e:
            error = e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed before the call returned
            pass

    threading.Thread(target=target, name=f"off-loop-{fn.__name__}", daemon=True).start()
    return future


def within(seconds: float, fn, *args) -> bool:
    """`fn(*args)` on a daemon thread; whether it returned within `seconds` (off_loop's
    twin for the calls after the loop has closed: `ray.shutdown`)."""
    done = threading.Event()

    def target() -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s failed", getattr(fn, "__name__", fn))
        finally:
            done.set()

    threading.Thread(target=target, name=f"within-{fn.__name__}", daemon=True).start()
    return done.wait(seconds)


def kill_and_release(actors: Sequence, namespace: str, names: Sequence[str]) -> None:
    """Kill the actors, then wait until they give up their names, so an engine restarted
    at once can take them again (`ray.kill` returns before the actor is gone). Blocking:
    run it off the loop."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception as e:  # gone already, or Ray is
            log.debug("killing an actor failed: %s", e)
    names_released(namespace, names)


def names_released(namespace: str, names: Sequence[str], patience: float = 10.0) -> None:
    """Wait until no actor holds `names`, `patience` seconds at most. Blocking."""
    deadline = time.monotonic() + patience
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                break
            time.sleep(0.05)


async def release_actors(actors: Sequence, namespace: str, names: Sequence[str], seconds) -> bool:
    """kill_and_release off the loop; False when Ray did not answer within `seconds`."""
    try:
        await asyncio.wait_for(off_loop(kill_and_release, actors, namespace, names), seconds)
        return True
    except asyncio.TimeoutError:
        log.error("Ray did not answer while the actors were killed (is its raylet gone?)")
        return False


def end_process(status: int, left: Sequence[str]) -> None:
    """End the process now with `status`: a stop step (`left`) still waits on Ray, and
    the interpreter's exit would wait on it again (Ray's exit hook)."""
    log.error("exiting with %s still waiting on Ray", ", ".join(left))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
