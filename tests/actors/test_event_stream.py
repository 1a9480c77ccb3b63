"""The model replica's event stream: frames, the handshake, one frame per step.

The frame format and the server run over real sockets on the loopback; the
last test counts what a real model actor sent for four concurrent streams.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest

from engine.actors.event_stream import FRAME, EventServer, decode, encode, read_frame
from engine.cache.kinds import RestoreKind
from engine.runtime.events import (
    Finished,
    FinishReason,
    Progress,
    Timing,
    TokenLogprobs,
    Tokens,
)

FINISHED = Finished(
    request_id="r1",
    finish_reason=FinishReason.LENGTH,
    prompt_tokens=10,
    cached_tokens=4,
    completion_tokens=3,
    restore_kind=RestoreKind.REPLY,
    restore_length=4,
    timing=Timing(ttft_ms=1.5, decode_tps=300.0, bytes_copied_restore=64),
    replica="0",
    restore_lost="7@4",
    incomplete=True,
)
LOGPROBS = (TokenLogprobs(-0.5, ((3, -0.5), (9, -1.25))), TokenLogprobs(-2.0))


@pytest.mark.parametrize(
    "event",
    [
        Tokens(ids=(1, 2, 3), text=""),
        Tokens(ids=(3, 4), text="", logprobs=LOGPROBS),
        Tokens(ids=(5,), text="", index=2),
        Progress(done=256, total=1024),
        FINISHED,
    ],
    ids=["tokens", "logprobs", "branch", "progress", "finished"],
)
def test_a_frame_carries_each_event_as_it_was(event):
    frame = encode([("r1", event), ("r2", event)])
    (size,) = FRAME.unpack_from(frame)
    assert size == len(frame) - FRAME.size
    assert decode(frame[FRAME.size :]) == [("r1", event), ("r2", event)]


@pytest.mark.parametrize("body", [b"not json", b'[["x", "r1"]]', b'[["t"]]', b"{}"])
def test_a_malformed_frame_is_refused(body):
    with pytest.raises(ValueError, match="malformed event frame"):
        decode(body)


def _hello(sock: socket.socket, secret: str, stream: str) -> None:
    body = json.dumps({"secret": secret, "stream": stream}).encode()
    sock.sendall(FRAME.pack(len(body)) + body)


@pytest.fixture
def server():
    lost: list[str] = []
    gone = threading.Event()

    def on_lost(stream: str) -> None:
        lost.append(stream)
        gone.set()

    s = EventServer("127.0.0.1", on_lost)
    s.lost, s.gone = lost, gone
    yield s
    s.close()


def _connect(server, stream: str, secret: str | None = None) -> socket.socket:
    sock = socket.create_connection((server.address.host, server.address.port), timeout=5)
    _hello(sock, server.address.secret if secret is None else secret, stream)
    return sock


def test_a_connection_without_the_secret_is_closed(server):
    with _connect(server, "s1", secret="0" * 32) as sock:
        assert sock.recv(16) == b""  # closed, no acknowledgement
    assert not server.connected("s1")


def test_each_stream_gets_one_frame_per_flush_with_its_events(server):
    a, b = _connect(server, "a"), _connect(server, "b")
    for sock in (a, b):
        assert json.loads(read_frame(sock)) == {"ok": True}
    emit_a1, emit_a2 = server.emitter("a", "r1"), server.emitter("a", "r2")
    emit_b = server.emitter("b", "r3")
    emit_a1(Tokens(ids=(5,), text=""))
    emit_a2(Tokens(ids=(6,), text=""))
    emit_b(Progress(done=1, total=2))
    emit_a1(Tokens(ids=(7,), text=""))
    server.flush()
    server.flush()  # nothing queued: nothing sent
    assert decode(read_frame(a)) == [
        ("r1", Tokens(ids=(5,), text="")),
        ("r2", Tokens(ids=(6,), text="")),
        ("r1", Tokens(ids=(7,), text="")),
    ]
    assert decode(read_frame(b)) == [("r3", Progress(done=1, total=2))]
    assert (server.frames, server.events) == (2, 4)
    a.settimeout(0.2)
    with pytest.raises(TimeoutError):
        a.recv(1)
    a.close(), b.close()


def test_a_front_end_that_goes_is_reported_lost(server):
    sock = _connect(server, "s2")
    read_frame(sock)
    sock.close()
    assert server.gone.wait(5)
    assert server.lost == ["s2"] and not server.connected("s2")


def test_four_streams_leave_the_model_in_one_frame_per_step(engine):
    """Four requests decoding together: their tokens leave in about one frame per step,
    not one per token (a frame per token would be at least as many frames as events)."""
    import ray

    from clients.client import AsyncClient

    model = engine.engine.model
    before = ray.get(model.event_stats.remote())

    async def four():
        async with AsyncClient(engine.address) as client:
            prompts = [f"stream {i}: the frames of a step" for i in range(4)]
            return await asyncio.gather(
                *(client.generate(prompt=p, max_tokens=48, temperature=0.0) for p in prompts)
            )

    results = asyncio.run(four())
    after = ray.get(model.event_stats.remote())
    frames, events = after["frames"] - before["frames"], after["events"] - before["events"]
    tokens = sum(len(r.token_ids) for r in results)
    assert tokens >= 4 * 8 and events >= tokens
    assert frames < events / 2, (frames, events)
