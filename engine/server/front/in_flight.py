"""The requests the front end has in flight: their ids, sessions, prompts and cancels.

`InFlight` gives each accepted request its id inside the engine (a client's id
names one request per namespace; one another namespace has in flight runs
under a suffix no client id can have), keeps the session key and the volatile
lines it named (its log line and its record), the prompt of each request
running on a replica, and the cancels on their way. A retry of a dropped call
waits for them (`superseded`), so it restores what the dropped call computed.
It knows asyncio and token arrays; nothing of replicas' events or plans.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import numpy as np

from engine.server.errors import ActorGone, InvalidRequest

log = logging.getLogger("lineage.request")


class InFlight:
    """Every request from acceptance to the end of its stream, by its id inside the engine."""

    def __init__(self):
        # Every (namespace, id) from acceptance to the end of its stream -> the id inside.
        self.request_ids: dict[tuple[str, str], str] = {}
        self.internal_ids: set[str] = set()
        self.sessions: dict[str, str] = {}  # request id -> the session key it named
        self.volatile: dict[str, int] = {}  # request id -> volatile lines removed
        self.prompts: dict[str, tuple[str, np.ndarray]] = {}  # running: id -> (namespace, prompt)
        self.cancelling: dict = {}  # cancel task -> (namespace, prompt, id): a retry waits on it

    def accept(self, namespace: str, given: str, session: str) -> str:
        """The id inside the engine of the request its client calls `given`; InvalidRequest
        when that id is already in flight in `namespace`."""
        key = (namespace, given)  # ids are unique per namespace: no tenant sees another's
        if key in self.request_ids:
            raise InvalidRequest(f"request_id {given!r} is already in flight")
        request_id = given if given not in self.internal_ids else f"{given}~{uuid.uuid4().hex}"
        self.request_ids[key] = request_id
        self.internal_ids.add(request_id)
        if session:
            self.sessions[request_id] = session
        return request_id

    def done(self, namespace: str, given: str, request_id: str) -> None:
        """The request's stream ended: its id and what it named are forgotten."""
        del self.request_ids[(namespace, given)]
        self.internal_ids.discard(request_id)
        self.volatile.pop(request_id, None)
        self.sessions.pop(request_id, None)

    async def superseded(
        self, namespace: str, tokens: np.ndarray, request_id: str = "", patience: float = 0.5
    ) -> None:
        """A prompt that extends an in-flight prompt is a retry of a dropped call.

        Its client has gone, but the server may not have seen the cancellation
        yet (it races the new call): wait briefly for it to land, then for its
        commit, so the retry restores what the dropped call computed. Only the
        cancels of prompts this one extends (or of its own request id) are waited for.
        """
        deadline = time.monotonic() + patience
        while _extends(tokens, namespace, self.prompts.values()):
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.01)
        mine = [
            t
            for t, (ns, prompt, rid) in self.cancelling.items()
            if rid == request_id or _extends(tokens, namespace, [(ns, prompt)])
        ]
        if mine:
            await asyncio.wait(mine, timeout=2.0)

    def cancel(self, replica, request_id: str, deadline: float) -> None:
        """Cancel a running request on its replica; a retry of it may wait for the cancel."""
        namespace, tokens = self.prompts[request_id]
        ref = replica.cancel.remote(request_id)
        task = asyncio.ensure_future(await_ref(ref, deadline))
        self.cancelling[task] = (namespace, tokens, request_id)
        task.add_done_callback(lambda t: self.cancelling.pop(t, None))


async def await_ref(ref, deadline: float) -> None:
    """An actor call answered, or given up at its deadline (a dead or stuck actor)."""
    try:
        await asyncio.wait_for(ref, deadline)
    except (ActorGone, asyncio.TimeoutError):  # a dead or stuck actor: nothing to wait for
        pass
    except Exception:  # anything else is a bug in the cancel path: say so
        log.exception("cancelling a request failed")


def _extends(tokens: np.ndarray, namespace: str, prompts) -> bool:
    """Whether `tokens` extends (or equals) one of the (namespace, prompt) pairs."""
    for ns, prompt in prompts:
        n = len(prompt)
        if ns == namespace and n <= len(tokens) and np.array_equal(tokens[:n], prompt):
            return True
    return False
