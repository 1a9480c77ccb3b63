"""`lineage bench slowloris`'s slow clients against a real bridge: what they report moves
(connections cut in their headers, 408s, how many were open at once)."""

from __future__ import annotations

import queue
import threading

from clients.bench.slowloris import slow_clients
from clients.bridge.guard import BridgeSecurity
from clients.bridge.server import start_bridge
from engine.server.running.background import BackgroundLoop


def test_the_slow_clients_count_what_the_bridge_does_to_them():
    loop = BackgroundLoop("slowloris-test")
    security = BridgeSecurity(header_deadline=0.5, body_deadline=0.8)
    handle = loop.call(start_bridge("127.0.0.1:1", "127.0.0.1", 0, security))  # no engine
    stop, out = threading.Event(), queue.Queue()
    try:
        clients = threading.Thread(target=slow_clients, args=(handle.port, 6, 2, 0.1, stop, out))
        clients.start()
        threading.Event().wait(3.0)
        stop.set()
        clients.join(30)
        stats = out.get(timeout=30)
    finally:
        stop.set()
        loop.call(handle.stop(grace=0.5))
        loop.close()
    assert stats["open_max"] == 6 and stats["refused"] == 0, stats
    assert stats["cut_in_headers"] >= 4 and stats["answered_408"] >= 2, stats
    assert stats["opened"] > 6, stats  # the cut ones came back
