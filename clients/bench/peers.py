"""The MLX servers the benchmarks measure ours against, each in a venv of its own.

`mlx_lm.server` runs from this environment's mlx-lm. mlx-vlm's server
(`python -m mlx_vlm.server`, its prefix cache on: APC_ENABLED=1) and
Rapid-MLX's (`rapid-mlx serve`) pin versions of mlx, mlx-lm and transformers
of their own, so each lives in a venv under the peers folder
(`LINEAGE_PEERS_DIR`, default `.cache/peers` of the checkout, ignored by
git): `install(name)` makes it (`lineage bench decode --install-peers` or
`bench concurrency --install-peers`), `start(name, model_dir)` runs the
server from it. Rapid-MLX is installed without torch and torchvision, which
it declares but loads only for audio and checkpoint conversion.

A peer that cannot run here is never an error: `unavailable(name)` says why
(not installed, its install failed, its server failed to start: with pip's or
the server's last lines), and the benchmarks print that reason in place of its
figures. Each start gets a cache home of its own and Rapid-MLX no disk caches,
so no prefix cache outlives a run (a second round would find the first's cold
prompts cached). Peers are given a view of the model directory without files they
do not load (`mtp.safetensors`: mlx-vlm refuses weights its model lacks).
It knows servers as command lines; the client is clients.bench.peer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from clients.bench.peer import MlxLmServer, PeerServer

ROOT = Path(__file__).resolve().parents[2]
MLX = "mlx[cpu]>=0.32,<0.33" if sys.platform != "darwin" else "mlx>=0.32,<0.33"
PEER_ONLY_FILES = ("mtp.safetensors",)  # not loaded by the peers (module doc)

# Rapid-MLX's dependencies not installed: used for audio and checkpoint conversion only.
RAPID_SKIPPED = ("torch", "torchvision")
_REQUIRES = """
import importlib.metadata as m, sys
from pip._vendor.packaging.requirements import Requirement
skip = set(sys.argv[2:])
for text in m.requires(sys.argv[1]) or ():
    r = Requirement(text)
    if r.name.lower() not in skip and (r.marker is None or r.marker.evaluate({"extra": ""})):
        print(str(r).split(";")[0])
"""


@dataclass(frozen=True)
class Peer:
    """A server: its pinned package, how to install it, its command line (`{py}`: the venv's
    python, `{model}`, `{port}`), its environment."""

    name: str
    package: str = ""  # "": this environment's (mlx_lm.server)
    argv: tuple = ()
    env: dict = field(default_factory=dict)
    skip_deps: tuple = ()  # installed with --no-deps, then its requirements less these


PEERS = {
    "mlx_lm.server": Peer("mlx_lm.server"),
    "mlx_vlm.server": Peer(
        "mlx_vlm.server",
        "mlx-vlm==0.7.10",
        (
            "{py}",
            "-m",
            "mlx_vlm.server",
            "--model",
            "{model}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ),  # fmt: skip
        {"APC_ENABLED": "1"},
    ),
    "rapid_mlx": Peer(
        "rapid_mlx",
        "rapid-mlx==0.16.10",
        (
            "{py}",
            "-m",
            "rapid_mlx.cli",
            "serve",
            "{model}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--no-preflight",  # a local directory: nothing to check before a download
            "--disable-disk-caches",  # each run starts cold, as ours does
        ),
        skip_deps=RAPID_SKIPPED,
    ),
}


def peers_dir() -> Path:
    return Path(os.environ.get("LINEAGE_PEERS_DIR") or ROOT / ".cache" / "peers")


def venv(name: str) -> Path:
    """Peer `name`'s venv: the peers folder's subfolder named as its package."""
    return peers_dir() / PEERS[name].package.split("==")[0]


def _python(name: str) -> Path:
    return venv(name) / "bin" / "python"


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if not line.startswith("WARNING:")]
    return " | ".join(lines[-n:])


def unavailable(name: str) -> str | None:
    """Why peer `name` cannot run here, or None when it can."""
    peer = PEERS[name]
    if not peer.package:
        return None
    python = _python(name)
    if not python.exists():
        return f"{peer.package} is not installed in {venv(name)} (--install-peers installs it)"
    failed = venv(name) / "install-failed.txt"
    if failed.exists():
        return f"{peer.package} failed to install here: {failed.read_text().strip()}"
    module = peer.argv[2] if peer.argv[1:2] == ("-m",) else None
    if module:
        probe = subprocess.run(
            [str(python), "-c", f"import {module.split('.')[0]}"], capture_output=True, text=True
        )
        if probe.returncode:
            return f"{peer.package} does not import here: {_last_lines(probe.stderr, 1)}"
    return None


def install(name: str) -> str | None:
    """Make peer `name`'s venv and install its pinned package (once); None, or why it failed."""
    peer = PEERS[name]
    if not peer.package or _python(name).exists() and unavailable(name) is None:
        return None
    path = venv(name)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    pip = [str(_python(name)), "-m", "pip", "install", "-q"]
    steps = [pip + ([peer.package, "--no-deps"] if peer.skip_deps else [peer.package, MLX])]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode == 0 and peer.skip_deps and step is steps[0]:
            dist = peer.package.split("==")[0]
            reqs = subprocess.run(
                [str(_python(name)), "-c", _REQUIRES, dist, *peer.skip_deps],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            steps.append(pip + reqs.stdout.split() + [MLX])
        if done.returncode:
            reason = _last_lines(done.stderr)
            (path / "install-failed.txt").write_text(reason + "\n")
            return reason
    return None


def model_view(model_dir: str) -> str:
    """`model_dir`, or a folder of links to its files less PEER_ONLY_FILES when it has any."""
    src = Path(model_dir).resolve()
    if not any((src / f).exists() for f in PEER_ONLY_FILES):
        return str(src)
    view = peers_dir() / "models" / src.name
    view.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = view / f.name
        if f.name not in PEER_ONLY_FILES and not link.exists():
            link.symlink_to(f)
    return str(view)


def start(name: str, model_dir: str, log_path: str | None = None) -> PeerServer:
    """Peer `name`'s server on `model_dir`, answering (it may take minutes: first imports)."""
    if name == "mlx_lm.server":
        return MlxLmServer(model_dir, log_path=log_path)
    peer = PEERS[name]
    model = model_view(model_dir)
    subs = {"{py}": str(_python(name)), "{model}": model}
    argv = [subs.get(a, a) for a in peer.argv]
    log = log_path or str(venv(name) / "server.log")
    # A cache home of its own per start: no prefix cache on disk outlives a run.
    home = tempfile.mkdtemp(prefix="cache-", dir=venv(name))
    env = {**peer.env, "MLX_VLM_CACHE_HOME": home, "RAPID_MLX_DISABLE_DISK_CACHES": "1"}
    return PeerServer(name, argv, env=env, log_path=log, start_timeout_s=300, model=model)


def start_or_reason(name: str, model_dir: str) -> tuple[PeerServer | None, str | None]:
    """(`start`'s server, None), or (None, why it cannot run here: the log's last lines)."""
    reason = unavailable(name)
    if reason:
        return None, reason
    try:
        return start(name, model_dir), None
    except (RuntimeError, TimeoutError) as e:
        log = venv(name) / "server.log"
        tail = _last_lines(log.read_text(errors="replace")) if log.exists() else ""
        return None, f"{e}: {tail}" if tail else str(e)
