"""The front end's end of the replicas' event streams (engine.actors.event_stream).

One `ReplicaEvents` per model replica: a TCP connection to the replica's
event server, opened on first use and again after the replica restarted
(a new incarnation refuses the old stream id), read by an asyncio protocol
that splits frames and hands each request its events: one queue item per
request per frame (a step's events together). A request registers its queue
before it is submitted, so no event can come before it.

What can end a request's stream here: the connection closing (the replica
died, or was reset: `LOST`), or nothing for `silence` seconds (`SILENT`,
checked once a second for all requests). It knows asyncio and the frame
format; nothing of gRPC, tokens or the cache.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Callable

from engine.actors.event_stream import FRAME, MAX_FRAME, EventAddress, decode

log = logging.getLogger(__name__)

LOST = "lost"  # the replica's connection closed: it died or was restarted
SILENT = "silent"  # nothing came for the request within the silence deadline


class _Reader(asyncio.Protocol):
    """Splits the byte stream into frames; the first is the server's acknowledgement."""

    def __init__(self, owner: "ReplicaEvents"):
        self.owner = owner
        self.buffer = bytearray()
        self.acknowledged: asyncio.Future = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= FRAME.size:
            (size,) = FRAME.unpack_from(self.buffer)
            if size > MAX_FRAME:
                self.owner.broken(f"a frame of {size} bytes")
                return
            if len(self.buffer) < FRAME.size + size:
                return
            body = bytes(self.buffer[FRAME.size : FRAME.size + size])
            del self.buffer[: FRAME.size + size]
            if not self.acknowledged.done():
                self.acknowledged.set_result(body)
                continue
            try:
                self.owner.deliver(decode(body))
            except ValueError as error:
                self.owner.broken(str(error))
                return

    def connection_lost(self, exc) -> None:
        if not self.acknowledged.done():
            self.acknowledged.set_exception(ConnectionError("closed before the handshake"))
        self.owner.lost(self)


class ReplicaEvents:
    """The event stream of one replica: connect once, route frames to requests' queues."""

    def __init__(
        self, model, front_end_ip: str, silence: Callable[[], float], deadline: float = 30.0
    ):
        self.model = model  # the ModelActor handle
        self.ip = front_end_ip
        self.silence = silence  # seconds a request may hear nothing (read at each check)
        self.deadline = deadline
        self.stream = ""  # this connection's id; a new one per connection
        self.queues: dict[str, asyncio.Queue] = {}
        self.heard: dict[str, float] = {}  # request id -> when it last got an event
        self._transport = None
        self._reader: _Reader | None = None
        self._connecting: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    async def connect(self) -> str:
        """The open stream's id (connecting first when there is none)."""
        if self.connected:
            return self.stream
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._connecting)
        return self.stream

    async def _connect(self) -> None:
        address: EventAddress = await asyncio.wait_for(
            self.model.open_events.remote(self.ip), self.deadline
        )
        loop = asyncio.get_running_loop()
        stream = uuid.uuid4().hex
        transport, reader = await asyncio.wait_for(
            loop.create_connection(lambda: _Reader(self), address.host, address.port),
            self.deadline,
        )
        hello = json.dumps({"secret": address.secret, "stream": stream}).encode()
        transport.write(FRAME.pack(len(hello)) + hello)
        try:
            await asyncio.wait_for(asyncio.shield(reader.acknowledged), self.deadline)
        except BaseException:
            transport.close()
            raise
        self._transport, self._reader, self.stream = transport, reader, stream
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._watch_silence())

    def register(self, request_id: str) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[request_id] = queue
        self.heard[request_id] = time.monotonic()
        return queue

    def unregister(self, request_id: str) -> None:
        self.queues.pop(request_id, None)
        self.heard.pop(request_id, None)

    def deliver(self, pairs: list) -> None:
        """One frame: each request's events of it, as one queue item."""
        now = time.monotonic()
        grouped: dict[str, list] = {}
        for rid, event in pairs:
            grouped.setdefault(rid, []).append(event)
        for rid, events in grouped.items():
            queue = self.queues.get(rid)
            if queue is not None:  # else: a request that went already
                self.heard[rid] = now
                queue.put_nowait(events)

    def broken(self, why: str) -> None:
        log.error("the event stream of a replica is broken (%s); reconnecting", why)
        if self._transport is not None:
            self._transport.close()

    def lost(self, reader: _Reader) -> None:
        """The connection closed: every request on it ends (the replica died or restarted)."""
        if reader is not self._reader:
            return
        self._transport = self._reader = None
        for queue in self.queues.values():
            queue.put_nowait(LOST)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._transport is not None:
            self._transport.close()

    async def _watch_silence(self) -> None:
        """Once a second: a request that heard nothing for `silence` seconds is told so."""
        while True:
            silence = self.silence()
            await asyncio.sleep(min(1.0, silence / 4))
            late = time.monotonic() - silence
            for rid, when in list(self.heard.items()):
                if when < late and rid in self.queues:
                    self.heard[rid] = float("inf")  # told once
                    self.queues[rid].put_nowait(SILENT)
