"""What keeps one client test from another on the session's engine: a namespace, a port.

`fresh_ns` gives a cache namespace no other test uses in this session (one
counter for every test module), so no other test's entries serve this one;
`free_port` a localhost port with nothing listening on it. Plain Python.
"""

from __future__ import annotations

import itertools
import socket

_ns = itertools.count()


def fresh_ns() -> str:
    """A cache namespace of its own, so that no other test's entries serve this one."""
    return f"cli-{next(_ns)}"


def free_port() -> int:
    """A localhost port with nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
