"""Events from a model replica to a front end: one socket per (front end, replica), one frame
per step of the model loop.

A Ray streaming generator per request costs CPU per item in both processes
(the actor's and the driver's), and an item per token per stream: on a small
CPU, more than the decode step itself at a few streams. Here every event the
loop emits during a step is queued (`emitter`), and once the step ends
(`flush`, from the loop thread) each front end's events of that step leave as
ONE length-prefixed frame on a TCP connection of its own: one frame's CPU,
whatever the number of streams. Requests still go to the actor as Ray calls
(plans, cancels); only the events take this path (an equivalent message
stream: no shared memory and no global lock).

The connection: the front end asks the actor to listen (`EventServer`, on
the loopback when the front end runs on the same machine, else on the
actor's node address), gets (host, port, secret) back through Ray, connects
and sends the secret and its stream id in a first frame; the server answers
one frame of acknowledgement. A wrong secret closes the socket. Frames are
JSON (no pickle: a frame is data, never code).

The loop thread writes without blocking: a frame the socket cannot take at
once waits in the connection's buffer for its writer thread, which also
notices a closed peer (`on_lost`). A peer that stops reading is dropped once
its buffer passes `MAX_BUFFER`.

`encode`/`decode` are the frame format, shared with the front end's reader
(engine.server.supervision.replica_events). It knows sockets and the events' dataclasses;
nothing of Ray, MLX or the Generator.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import os
import secrets
import select
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Callable

from engine.cache.kinds import RestoreKind
from engine.runtime.events import (
    Finished,
    FinishReason,
    Progress,
    Timing,
    TokenLogprobs,
    Tokens,
)

log = logging.getLogger(__name__)

FRAME = struct.Struct("<I")  # a frame's length, then its JSON body
MAX_FRAME = 64 << 20
MAX_BUFFER = 256 << 20  # bytes queued for a front end that stopped reading: it is dropped
HANDSHAKE_TIMEOUT = 10.0


@dataclass(frozen=True)
class EventAddress:
    """Where a front end connects for a replica's events, and the secret it proves itself by."""

    host: str
    port: int
    secret: str


# ------------------------------------------------------------------ frames ----


def encode(pairs: list[tuple[str, object]]) -> bytes:
    """(request id, event) pairs -> one frame (length prefix included)."""
    body = json.dumps([_event_row(rid, e) for rid, e in pairs], separators=(",", ":")).encode()
    return FRAME.pack(len(body)) + body


def _event_row(rid: str, event) -> list:
    if isinstance(event, Tokens):
        if event.logprobs or event.index:  # [logprob, [[id, logprob], ...]] per id; the branch
            logprobs = [[lp.logprob, lp.top] for lp in event.logprobs]
            return ["t", rid, list(event.ids), logprobs, event.index]
        return ["t", rid, list(event.ids)]
    if isinstance(event, Progress):
        return ["p", rid, event.done, event.total]
    assert isinstance(event, Finished), event
    fields = dataclasses.asdict(event)
    fields["finish_reason"] = event.finish_reason.value
    fields["restore_kind"] = event.restore_kind.value
    return ["f", rid, fields]


def decode(body: bytes) -> list[tuple[str, object]]:
    """One frame's body -> (request id, event) pairs. ValueError on anything malformed."""
    try:
        rows = json.loads(body)
        if not isinstance(rows, list):
            raise TypeError(f"a {type(rows).__name__}, not a list")
        return [(str(row[1]), _event_of(row)) for row in rows]
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise ValueError(f"malformed event frame: {error}") from None


def _event_of(row: list):
    kind = row[0]
    if kind == "t":
        logprobs = tuple(
            TokenLogprobs(float(lp), tuple((int(i), float(v)) for i, v in top))
            for lp, top in (row[3] if len(row) > 3 else ())
        )
        index = int(row[4]) if len(row) > 4 else 0
        return Tokens(ids=tuple(int(i) for i in row[2]), text="", logprobs=logprobs, index=index)
    if kind == "p":
        return Progress(done=int(row[2]), total=int(row[3]))
    if kind == "f":
        fields = dict(row[2])
        fields["finish_reason"] = FinishReason(fields["finish_reason"])
        fields["restore_kind"] = RestoreKind(fields["restore_kind"])
        fields["timing"] = Timing(**fields["timing"])
        return Finished(**fields)
    raise ValueError(f"unknown event kind {kind!r}")


def read_frame(sock: socket.socket) -> bytes:
    """One whole frame's body from a blocking socket (the handshake)."""
    (size,) = FRAME.unpack(_read_exactly(sock, FRAME.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            raise ConnectionError("closed")
        data += more
    return data


# -------------------------------------------------------------- the server ----


class EventServer:
    """Listens for front ends on `host` and sends each the events queued for its stream.

    `emitter(stream, request_id)` and `flush()` run on the model loop thread
    (nothing else touches the queue); connections arrive on an accept thread.
    `on_lost(stream)` runs (on that connection's thread) when a front end goes.
    """

    def __init__(self, host: str, on_lost: Callable[[str], None] = lambda stream: None):
        self.secret = secrets.token_hex(16)
        self.on_lost = on_lost
        self.listener = socket.create_server((host, 0))
        self.address = EventAddress(host, self.listener.getsockname()[1], self.secret)
        self.connections: dict[str, _Connection] = {}  # replaced whole, never mutated
        self._queued: dict[str, list] = {}  # stream -> [(request id, event)], loop thread only
        self.frames = 0  # frames sent, and the events in them (bench decode, tests)
        self.events = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="event-accept", daemon=True).start()

    def emitter(self, stream: str, request_id: str) -> Callable[[object], None]:
        """The Emit of one request: its events queue for the stream's next frame."""

        def emit(event) -> None:
            queued = self._queued.get(stream)
            if queued is None:
                queued = self._queued[stream] = []
            queued.append((request_id, event))

        return emit

    def flush(self) -> None:
        """Send each stream the events queued since the last flush, one frame each."""
        if not self._queued:
            return
        queued, self._queued = self._queued, {}
        connections = self.connections
        for stream, pairs in queued.items():
            connection = connections.get(stream)
            if connection is not None:  # a stream that went: its requests are cancelled
                connection.send(encode(pairs))
                self.frames += 1
                self.events += len(pairs)

    def connected(self, stream: str) -> bool:
        return stream in self.connections

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for connection in list(self.connections.values()):
            connection.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._greet, args=(sock,), name="event-greet", daemon=True
            ).start()

    def _greet(self, sock: socket.socket) -> None:
        """The first frame must carry the secret and a stream id; then the stream is open."""
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT)
            hello = json.loads(read_frame(sock))
            given = str(hello.get("secret", "")).encode()
            stream = str(hello.get("stream", ""))
            if not stream or not hmac.compare_digest(given, self.secret.encode()):
                log.warning("event stream: a connection without the secret was refused")
                sock.close()
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(sock, stream, self._lost)
            with self._lock:
                old = self.connections.get(stream)
                self.connections = {**self.connections, stream: connection}
            if old is not None:
                old.close()
            body = b'{"ok":true}'
            sock.settimeout(None)
            sock.sendall(FRAME.pack(len(body)) + body)
            sock.setblocking(False)
            connection.start()
        except (OSError, ValueError) as error:
            log.warning("event stream: handshake failed: %s", error)
            sock.close()

    def _lost(self, connection: "_Connection") -> None:
        with self._lock:
            if self.connections.get(connection.stream) is not connection:
                return
            self.connections = {k: v for k, v in self.connections.items() if v is not connection}
        self.on_lost(connection.stream)


class _Connection:
    """One front end's socket: the loop thread sends without blocking, the rest waits here."""

    def __init__(self, sock: socket.socket, stream: str, on_lost: Callable):
        self.sock, self.stream, self.on_lost = sock, stream, on_lost
        self.buffer = bytearray()
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = os.pipe()
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"event-{self.stream[:8]}", daemon=True).start()

    def send(self, data: bytes) -> None:
        """Queue a frame; what the socket takes at once leaves now (loop thread)."""
        with self.lock:
            if self.closed:
                return
            if not self.buffer:
                try:
                    data = data[self.sock.send(data) :]
                except BlockingIOError:
                    pass
                except OSError:
                    self._close_locked()
                    return
                if not data:
                    return
            self.buffer += data
            if len(self.buffer) > MAX_BUFFER:
                log.error("event stream %s: the front end stopped reading; dropped", self.stream)
                self._close_locked()
                return
            os.write(self.wake_w, b"x")  # its writer waits for the socket to take the rest

    def close(self) -> None:
        with self.lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                os.write(self.wake_w, b"x")
            except OSError:
                pass

    def _run(self) -> None:
        """Drain the buffer when the socket takes it; notice the peer closing."""
        try:
            while not self.closed:
                want_write = bool(self.buffer)
                readable, writable, _ = select.select(
                    [self.sock, self.wake_r], [self.sock] if want_write else [], []
                )
                if self.wake_r in readable:
                    os.read(self.wake_r, 4096)
                if self.sock in readable and not self.sock.recv(4096):
                    break  # the front end closed its side
                if writable:
                    with self.lock:
                        sent = self.sock.send(self.buffer)
                        del self.buffer[:sent]
        except OSError:
            pass
        finally:
            with self.lock:
                self.closed = True
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            self.sock.close()
            self.on_lost(self)
