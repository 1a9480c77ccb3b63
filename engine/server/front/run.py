"""The streaming of one run: a planned request on its replica, its events with their text.

`Runs.stream` hands a GenerationRequest to the replica its plan names, reads its
events off that replica's event stream (engine.server.supervision.replica_events),
makes each branch's text and stop strings (engine.server.front.reply), tells the
manager when its prefill ended, records the finished request
(engine.server.front.inspection) and cancels one left unfinished. A replica
that died, was reset or went silent under it ends the run: `Restarted` (the
caller may run it again) or Unavailable. It knows one run; nothing of the
retries, the plan or the prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from engine.actors.handles import Handle, ManagerCalls, ModelCalls
from engine.runtime.branches import branch_key
from engine.runtime.events import Finished, FinishReason, Tokens
from engine.runtime.requests import GenerationRequest
from engine.server.errors import ActorGone, Unavailable
from engine.server.front.in_flight import InFlight
from engine.server.front.inspection import Inspector
from engine.server.front.reply import Reply
from engine.server.supervision.replica_events import LOST, SILENT, ReplicaEvents


class Restarted(Exception):
    """The replica died (`died`) or was reset under a request; retried if nothing streamed."""

    def __init__(self, message: str, died: bool):
        super().__init__(message)
        self.died = died


@dataclass
class Deadlines:
    """Seconds an actor call may take (`call`) and a stream may stay silent (`stream`)."""

    call: float
    stream: float


class Runs:
    """The runs of requests on the replicas, each streamed to its end."""

    def __init__(
        self,
        replicas: Sequence[Handle[ModelCalls]],
        events: Sequence[ReplicaEvents],
        manager: Handle[ManagerCalls],
        tokenizer,
        flight: InFlight,
        inspector: Inspector,
        deadlines: Deadlines,
        poke: Callable[[], None],
    ):
        self.replicas, self.events, self.manager = replicas, events, manager
        self.tokenizer = tokenizer  # the text of the token ids the model sends
        self.flight, self.inspector, self.deadlines = flight, inspector, deadlines
        self.poke = poke  # wakes the supervisor: a replica may have failed

    async def stream(self, req: GenerationRequest, streamed: list):
        """The events of `req` on its replica, with their text; Restarted when the replica
        went away or was reset under it. Tells the manager when its prefill ended."""
        replica = self.replicas[req.plan.replica]
        events = self.events[req.plan.replica]
        rid = req.request_id
        finished = prefilled = False
        self.flight.prompts[rid] = (req.namespace, np.asarray(req.tokens, dtype=np.int32))
        queue = events.register(rid)
        # One text per branch (SamplingParams.n); the request ends with its n-th Finished.
        reply = Reply(
            self.tokenizer,
            req.sampling,
            req.grammar is not None,
            lambda index: replica.stop.remote(branch_key(rid, index)),
        )
        completion = 0  # over the branches: one request, however many it ran (n)
        try:
            await self._submit(replica, events, req)
            while not finished:
                batch = await queue.get()
                if isinstance(batch, str):
                    self._ended(batch, req)
                out = []
                for event in batch:
                    if isinstance(event, Tokens):
                        event = reply.tokens(event)
                        if event is None:
                            continue
                    elif isinstance(event, Finished):
                        finished = reply.end()
                        if event.finish_reason == FinishReason.UNAVAILABLE:
                            self.poke()
                            raise Restarted(event.error, False)
                        *tail, event = reply.finish(event)
                        out += tail
                        completion += event.completion_tokens
                        if finished:  # counted once, with every branch's tokens
                            whole = dataclasses.replace(event, completion_tokens=completion)
                            volatile = self.flight.volatile.get(rid, 0)
                            session = self.flight.sessions.get(rid, "")
                            self.inspector.finished(whole, req, session, volatile)
                    if not prefilled and isinstance(event, (Tokens, Finished)):
                        prefilled = True
                        self.manager.prefilled.remote(rid)
                    out.append(event)
                if any(isinstance(e, Tokens) for e in out):
                    streamed[:] = [True]
                if out:
                    yield out
        finally:
            events.unregister(rid)
            if not prefilled:
                self.manager.prefilled.remote(rid)
            if not finished:
                self.flight.cancel(replica, rid, self.deadlines.call)
            self.flight.prompts.pop(rid, None)

    async def _submit(self, replica, events: ReplicaEvents, req: GenerationRequest):
        """Hand the request to its replica (connecting to its event stream first)."""
        try:
            stream = await events.connect()
            refused = await asyncio.wait_for(
                replica.submit.remote(req, stream), self.deadlines.call
            )
        except ActorGone as e:
            self.poke()
            raise Restarted(f"model replica {req.plan.replica} died ({e!r:.200})", True)
        except (asyncio.TimeoutError, OSError) as e:
            self.poke()
            raise Unavailable(f"model replica {req.plan.replica} did not answer ({e!r:.200})")
        if refused:  # planned in another epoch of the replica's, or a former incarnation's stream
            self.poke()
            raise Restarted(refused, False)

    def _ended(self, signal: str, req: GenerationRequest) -> None:
        """A request's stream ended without its final event: say why, as the caller expects."""
        self.poke()
        if signal == LOST:
            raise Restarted("the model stream ended without a final event", True)
        assert signal == SILENT, signal
        raise Unavailable(f"the model sent nothing for {self.deadlines.stream:.0f} s")
