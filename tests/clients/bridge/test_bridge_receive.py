"""The bridge's receive path under slow or heavy clients, on real sockets.

Under `lineage serve --http-port` the bridge shares the engine's event loop:
slow headers on many sockets held file descriptors forever, and bodies four
times the engine's request cap were parsed on that loop. Now headers and
bodies have deadlines, connections a cap, the body cap is no larger than the
engine's, and large bodies are parsed on a worker thread. No engine behind
these bridges: nothing here reaches one.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from clients.bridge.guard import BridgeSecurity
from clients.bridge.server import bridge_security, start_bridge
from engine.config import Limits, ServerConfig
from engine.server.running.background import BackgroundLoop

LOOP_NAME = "bridge-receive"


@pytest.fixture
def serve_bridge():
    """start(security) -> (host, port) of a bridge; all stopped at the end."""
    loop, handles = BackgroundLoop(LOOP_NAME), []

    def start(security: BridgeSecurity):
        handles.append(loop.call(start_bridge("127.0.0.1:1", "127.0.0.1", 0, security)))
        return handles[-1].host, handles[-1].port

    yield start
    for handle in handles:
        loop.call(handle.stop(grace=0.5))
    loop.close()


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within `seconds`, what it sent first)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True, got
            got += data
    except socket.timeout:
        return False, got
    except ConnectionResetError:
        return True, got


def security(**changes) -> BridgeSecurity:
    base = dict(header_deadline=0.5, body_deadline=0.5)
    return BridgeSecurity(**{**base, **changes})


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"G"],
    ids=["nothing", "half the headers", "one byte"],
)
def test_slow_headers_are_cut_off_at_the_deadline(serve_bridge, sent):
    address = serve_bridge(security())
    with socket.create_connection(address) as sock:
        sock.sendall(sent)
        closed, _ = closed_within(sock, 5.0)
    assert closed


def test_the_next_request_on_a_kept_connection_has_the_deadline_too(serve_bridge):
    address = serve_bridge(security())
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5.0)
        assert sock.recv(4096).startswith(b"HTTP/1.1 404")
        sock.sendall(b"GET /v1/nothing HTTP/1.1\r\nHo")  # then nothing more
        closed, _ = closed_within(sock, 5.0)
    assert closed


def test_an_idle_kept_connection_outlives_the_clients_idle_reuse(serve_bridge):
    """A client pool reuses a connection idle up to its expiry (httpx, so the OpenAI and
    Anthropic SDKs: 5 s); a server closing sooner or at the same moment races the next
    request, which fails without a reply. Idle here past the header deadline and past
    5 s, the connection still answers."""
    address = serve_bridge(security())
    with socket.create_connection(address) as sock:
        sock.settimeout(5.0)
        for _ in range(2):
            sock.sendall(b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 404")
            closed, _ = closed_within(sock, 5.5)
            assert not closed, "an idle kept connection was closed under the client"


def test_an_idle_kept_connection_closes_after_the_keep_alive(serve_bridge):
    address = serve_bridge(security(keep_alive=1.0))
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5.0)
        assert sock.recv(4096).startswith(b"HTTP/1.1 404")
        t0 = time.monotonic()
        closed, _ = closed_within(sock, 5.0)
    assert closed and 0.8 < time.monotonic() - t0 < 3.0


def test_a_slow_body_is_answered_408(serve_bridge):
    address = serve_bridge(security())
    with socket.create_connection(address) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"prompt": '
        )
        closed, answer = closed_within(sock, 5.0)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert closed


def test_requests_past_the_connection_cap_get_503_and_twice_as_many_are_closed(serve_bridge):
    address = serve_bridge(security(header_deadline=30.0, max_connections=2))
    held = [socket.create_connection(address) for _ in range(2)]
    try:
        time.sleep(0.2)
        with socket.create_connection(address) as third:  # past the cap: 503
            third.sendall(b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n")
            closed, answer = closed_within(third, 5.0)
        assert closed and answer.startswith(b"HTTP/1.1 503"), answer
        held += [socket.create_connection(address) for _ in range(2)]
        time.sleep(0.2)
        with socket.create_connection(address) as fifth:  # past twice the cap: closed
            closed, answer = closed_within(fifth, 5.0)
        assert closed and answer == b""
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    with httpx.Client(timeout=10) as http:  # their places are free again
        assert http.get(f"http://{address[0]}:{address[1]}/v1/nothing").status_code == 404


def test_the_body_cap_is_no_larger_than_the_engines_request_cap(serve_bridge):
    limits = Limits()
    gate = bridge_security(ServerConfig(), limits)
    assert gate.max_body_bytes <= limits.max_request_bytes
    big = bridge_security(ServerConfig(), Limits(max_body_bytes=limits.max_request_bytes * 4))
    assert big.max_body_bytes <= limits.max_request_bytes
    host, port = serve_bridge(gate)
    with httpx.Client(timeout=30) as http:
        body = b"{" + b" " * limits.max_request_bytes + b"}"
        r = http.post(f"http://{host}:{port}/v1/completions", content=body)
    assert r.status_code == 413


def test_large_bodies_are_parsed_off_the_event_loop(serve_bridge, monkeypatch):
    """The body's JSON is parsed on a worker thread, never on the loop the engine shares."""
    parsed_on = []
    loads = json.loads

    def watched(text, *args, **kwargs):
        if len(text) > 100_000:
            parsed_on.append(threading.current_thread().name)
        return loads(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", watched)
    host, port = serve_bridge(BridgeSecurity())
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 500_000}]}
    with httpx.Client(timeout=30) as http:
        r = http.post(f"http://{host}:{port}/v1/chat/completions", json=body)
    assert r.status_code == 503  # no engine behind it; the body was parsed first
    assert parsed_on and LOOP_NAME not in parsed_on, parsed_on
