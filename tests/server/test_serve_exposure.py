"""`lineage serve` listens on loopback alone: its Ray included.

A local `ray.init()` took the machine's network address, so Ray's Prometheus
exporter (every namespace's exact token counts), its GCS, raylet and workers
listened on every interface, even without `--metrics-port`. The session's
real `lineage serve --http-port --metrics-port` (the `served` fixture); its
process tree's listening sockets are read from /proc. The same tree runs at
one priority: Ray's workers (the model actor's decode) are not niced below
the front end.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_ip)
    if len(raw) == 4:
        return ipaddress.ip_address(raw[::-1])
    address = ipaddress.ip_address(struct.pack(">4I", *struct.unpack("<4I", raw)))
    return address.ipv4_mapped or address


def _tree(root: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


def niceness(pid: int) -> int | None:
    """The nice value of process `pid` (/proc/PID/stat's 19th field), None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    except OSError:
        return None


def listening(pids) -> list[tuple[str, object, int]]:
    """(process name, address, port) of every listening TCP socket of `pids`."""
    owners = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                owners[link[8:-1]] = name
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in owners:  # LISTEN
                ip, port = fields[1].split(":")
                out.append((owners[fields[9]], _address(ip), int(port, 16)))
    return out


def test_serve_and_its_ray_listen_on_loopback_alone(served):
    url = f"http://127.0.0.1:{served.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200  # the exporter is up, on loopback
    sockets = listening(_tree(served.process.pid))
    ports = {port for _, _, port in sockets}
    assert {served.metrics, served.http} <= ports, sockets
    exposed = [s for s in sockets if not s[1].is_loopback]
    assert not exposed, exposed
    own = niceness(served.process.pid)
    tree = {pid: niceness(pid) for pid in _tree(served.process.pid)}
    assert not {p: n for p, n in tree.items() if n not in (own, None)}, tree  # Ray's: 15
