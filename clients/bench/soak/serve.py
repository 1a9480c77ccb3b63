"""The `lineage serve` a soak drives: the process and its Ray's processes, from outside.

`Serve` starts `lineage serve` as a user does (a subprocess in a session of
its own, its output appended to one log across restarts), with the gRPC port,
the bridge's HTTP port and the cache directory fixed for the whole soak, so
a restart comes back on the same directory and ports. It stops it with
SIGTERM (as a service manager does) and waits for the whole process group to
go.

`processes()` names every live process of the serve by its role: the front end
(the `lineage serve` process: gRPC, the bridge, the supervisor), Ray's GCS,
raylet and helpers, the model actor (`model-0`: the soak serves one replica)
and the cache manager. Short-lived children (a compiler MLX runs once) are
left out. Ray's object store is read from the raylet's own count (its node
stats over its gRPC port, as `ray memory` reads them: the serve runs without
`--metrics-port`, as a user does, and so records no metrics), the logs from
the files. Nothing here joins the serve's Ray: the soak sees the server as its
users and operator do. psutil, grpc and Ray's messages are imported inside the
functions.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SERVING, BRIDGE = "lineage: serving", "OpenAI-compatible bridge on"  # the lines it prints
ALIASES = ("claude-*", "gpt-*")  # the agents' model names, served as the model
# cmdline pattern -> role; the first that matches names the process
ROLES = (
    (re.compile(r"^ray::(?:lineage-model-\d+:)?ModelActor"), "model"),
    (re.compile(r"^ray::(?:lineage-cache-manager:)?CacheManagerActor"), "cache-manager"),
    (re.compile(r"gcs_server"), "gcs"),
    (re.compile(r"raylet/raylet"), "raylet"),
    (re.compile(r"^ray::DashboardAgent"), "dashboard-agent"),
    (re.compile(r"^ray::RuntimeEnvAgent"), "runtime-env-agent"),
    (re.compile(r"ray/dashboard/dashboard\.py"), "dashboard"),
    (re.compile(r"ray/_private/log_monitor\.py"), "log-monitor"),
    (re.compile(r"ray/autoscaler/_private/monitor\.py"), "ray-monitor"),
    (re.compile(r"^ray::"), "ray-worker"),
)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def role_of(cmdline: list[str]) -> str | None:
    """The role of a process of the serve from its command line (None: not one we follow)."""
    line = " ".join(cmdline)
    for pattern, role in ROLES:
        m = pattern.search(line)
        if m:
            return role.format(*m.groups())
    return None


class Serve:
    """One `lineage serve` at a time on a fixed cache directory and fixed ports."""

    def __init__(self, workdir: Path, cache_dir: Path, flags: list[str], namespace: str):
        self.workdir, self.cache_dir, self.flags = Path(workdir), Path(cache_dir), flags
        self.env: dict[str, str] = {}  # set for the serve beside the soak's own environment
        self.namespace = namespace
        self.port, self.http_port = free_port(), free_port()
        self.log = self.workdir / "serve.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.failed_starts: list[str] = []  # the tail of each failed start's output
        self._raylet: tuple[int, int] | None = None  # (pid, its node manager's gRPC port)
        self._store: tuple | None = None  # (port, channel, stub, metadata) to the raylet
        # The sampler reads through it while the faults' thread stops the serve (closes it).
        self._store_lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "clients.cli", "serve", "--port", str(self.port)]
        command += ["--http-port", str(self.http_port), "--cache-dir", str(self.cache_dir)]
        command += ["--ray-namespace", self.namespace]
        for alias in ALIASES:
            command += ["--model-alias", alias]
        return command + self.flags

    def start(self, timeout: float = 600, tries: int = 10) -> float:
        """Start it, again after a start that failed (as a service manager restarts it: on a
        loaded machine Ray's raylet aborts when its agents take over 15 s to report their
        ports); the seconds until it
        served (its bridge up), the failed tries included."""
        t0 = time.monotonic()
        for attempt in range(1, tries + 1):
            try:
                self._start_once(timeout)
                return time.monotonic() - t0
            except RuntimeError as e:
                self.failed_starts.append(str(e)[-500:])
                if attempt == tries:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env.update(self.env)
        offset = self.log.stat().st_size if self.log.exists() else 0
        t0 = time.monotonic()
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        self.starts += 1
        while True:
            with self.log.open() as f:
                f.seek(offset)
                text = f.read()
            if SERVING in text and BRIDGE in text:
                return
            if self.process.poll() is not None or time.monotonic() - t0 > timeout:
                self.kill()
                raise RuntimeError(f"lineage serve did not start:\n{text[-3000:]}")
            time.sleep(0.5)

    def stop(self, timeout: float = 120) -> dict:
        """SIGTERM, as a service manager stops it; the seconds it took and its exit status.
        Whatever of its process group outlives `timeout` is killed (and counted)."""
        import psutil

        self._close_store()  # its raylet goes with it
        if self.process is None:
            return {"seconds": 0.0, "returncode": None, "killed": 0}
        group = self._group()
        t0 = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(30)
        _, alive = psutil.wait_procs(group, timeout=max(1.0, timeout - (time.monotonic() - t0)))
        for p in alive:
            p.kill()
        self.process = None
        return {"seconds": time.monotonic() - t0, "returncode": code, "killed": len(alive)}

    def kill(self) -> None:
        """All its processes, at once (a start that failed, a run cut short): its process
        group and any descendant Ray started in a session of its own."""
        import psutil

        self._close_store()  # the run's end, or its raylet goes with it
        if self.process is not None:
            group = self._group()
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for p in group:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(group, timeout=30)
            self.process.wait(30)
        self.process = None

    def _group(self) -> list:
        import psutil

        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    # ---- what runs ------------------------------------------------------------------

    def processes(self) -> dict[str, object]:
        """role -> psutil.Process of every process of the serve we follow."""
        import psutil

        if self.process is None:
            return {}
        out: dict[str, object] = {}
        try:
            root = psutil.Process(self.process.pid)
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        out["frontend"] = root
        for p in children:
            try:
                role = role_of(p.cmdline())
            except psutil.Error:
                continue
            if role == "model":  # the soak serves one replica
                role = "model-0"
            if role is not None and role in out:
                role = f"{role}-{p.pid}"
            if role is not None:
                out[role] = p
        return out

    def pid(self, role: str) -> int | None:
        p = self.processes().get(role)
        return p.pid if p is not None else None

    def ray_logs(self) -> Path | None:
        """Its Ray session's log directory (from the GCS's command line)."""
        gcs = self.processes().get("gcs")
        if gcs is None:
            return None
        m = re.search(r"--log_dir=(\S+)", " ".join(gcs.cmdline()))
        return Path(m.group(1)) if m else None

    def log_bytes(self) -> dict:
        """The serve's own log and its Ray session's logs, in bytes."""
        ray_logs = self.ray_logs()
        ray_bytes = 0
        if ray_logs is not None:
            for root, _, names in os.walk(ray_logs):
                for name in names:
                    try:
                        ray_bytes += os.path.getsize(os.path.join(root, name))
                    except OSError:
                        pass
        serve_bytes = self.log.stat().st_size if self.log.exists() else 0
        return {"serve_log_bytes": serve_bytes, "ray_log_bytes": ray_bytes}

    def object_store_bytes(self) -> int | None:
        """Bytes in Ray's object store: the raylet's `store_stats.object_store_bytes_used`
        from its GetNodeStats (memory info left out: no worker is asked), sent with the
        local Ray's token; None when unread. One channel serves the run: opened again
        only after an error or when the raylet is a new one (a new port), closed when the
        serve is stopped or killed."""
        import grpc
        from ray.core.generated import node_manager_pb2

        port = self.raylet_port()
        if port is None:
            return None
        request = node_manager_pb2.GetNodeStatsRequest(include_memory_info=False)
        with self._store_lock:
            if self._store is None or self._store[0] != port:
                self._drop_store()
                self._store = (port, *self._open_store(port))
            _, channel, stub, metadata = self._store
            try:
                reply = stub.GetNodeStats(request, timeout=5, metadata=metadata)
            except grpc.RpcError:
                self._drop_store()
                return None
        return int(reply.store_stats.object_store_bytes_used)

    @staticmethod
    def _open_store(port: int) -> tuple:
        """(channel, stub, metadata) of the raylet's node manager on `port`."""
        import grpc
        from ray._raylet import AuthenticationTokenLoader
        from ray.core.generated import node_manager_pb2_grpc

        token = AuthenticationTokenLoader.instance().get_token_for_http_header(
            ignore_auth_mode=True
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
        return channel, stub, tuple(token.items())

    def _close_store(self) -> None:
        """Close the channel to the raylet (a sample under way ends first)."""
        with self._store_lock:
            self._drop_store()

    def _drop_store(self) -> None:
        if self._store is not None:
            self._store[1].close()
            self._store = None

    def raylet_port(self) -> int | None:
        """The raylet's node manager port: it picks one at start (`--node_manager_port=0`)
        and says it in its log's first lines."""
        raylet, logs = self.processes().get("raylet"), self.ray_logs()
        if raylet is None or logs is None:
            return None
        if self._raylet is None or self._raylet[0] != raylet.pid:
            try:
                with (logs / "raylet.out").open() as f:
                    text = f.read(1 << 20)
            except OSError:
                return None
            m = re.search(r"NodeManager server started, listening on port (\d+)", text)
            if m is None:
                return None
            self._raylet = (raylet.pid, int(m.group(1)))
        return self._raylet[1]
