"""`lineage top`: a live view of a running engine, refreshed every second (rich).

One Inspect call per frame: per replica its queue, running sequences, tokens
per second and median time to first token; the cache's entries, anchors with
the sessions built on them, bytes per tier against budget bars, hit rates by
restore kind over the last minute, misses by why; the latest requests with
their restore kind, timings, and why one restored less than an earlier prompt
offered (`system@812 m0`: its system prompt changed at token 812, in message
0). `--once` prints one frame and exits (scripts, tests); `--model NAME`
shows that model's, when the server serves several. Knows
the server only through the client library; rich loads only when it runs, so
the command stays cheap to import.
"""

from __future__ import annotations

import argparse
import time

from clients.cli.args import add_server_arguments
from clients.client import Client
from engine.config import format_bytes

HELP = "live view of a running engine: replicas, cache tiers, hit rates, requests"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    p.add_argument("--requests", type=int, default=10, help="latest requests shown")
    p.add_argument(
        "--model", default="", help="with several models served: whose figures (default: the first)"
    )
    add_server_arguments(p)


def _replicas(snap: dict):
    from rich.table import Table

    t = Table(title="replicas", expand=True)
    for name in ("replica", "queue", "queued tok", "running", "tok/s", "TTFT p50", "RAM tier"):
        t.add_column(name, justify="left" if name == "replica" else "right")
    t.add_column("MLX active / peak", justify="right")
    for r in snap["replicas"]:
        t.add_row(
            r["name"],
            str(r["queue_requests"]),
            str(r["queue_prefill_tokens"]),
            str(r["running"]),
            f"{r['tokens_per_s']:.1f}",
            f"{r['ttft_p50_ms']:.0f} ms",
            format_bytes(r["ram_bytes"]),
            f"{format_bytes(r['mlx_active_bytes'])} / {format_bytes(r['mlx_peak_bytes'])}",
        )
    return t


def _tiers(snap: dict):
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    t = Table(title="bytes per tier", expand=True, show_header=False)
    t.add_column("tier")
    t.add_column("bar", ratio=1)
    t.add_column("held / budget", justify="right")
    for tier in snap["tiers"]:
        budget = max(tier["budget"], 1)
        bar = ProgressBar(total=budget, completed=min(tier["nbytes"], budget))
        share = tier["nbytes"] / budget
        held = f"{format_bytes(tier['nbytes'])} / {format_bytes(tier['budget'])} ({share:.0%})"
        t.add_row(tier["tier"], bar, held)
    return t


def _has_disk(replica: dict) -> bool:
    return (replica.get("disk_state") or "off") != "off"


def _disk(snap: dict):
    """The disk tier: each replica writing or paused, its writes lost by cause; the budget's
    bytes against the files' (clients.cli.disk_tier)."""
    from rich.table import Table

    from clients.cli.disk_tier import budget_text, lost_text, state_text

    t = Table(title=f"disk tier: {budget_text(snap['cache'])}", expand=True)
    for name in ("replica", "state", "files written", "writes lost"):
        t.add_column(name, justify="left" if name != "files written" else "right")
    for r in snap["replicas"]:
        if _has_disk(r):
            t.add_row(r["name"], state_text(r), str(r.get("disk_files_written", 0)), lost_text(r))
    return t


def _cache(snap: dict):
    from rich.table import Table

    c = snap["cache"]
    t = Table(title=f"cache ({c['mode']})", expand=True)
    for name in ("entries", "anchors", "checkpoints", "on disk", "evictions RAM/disk", "misses"):
        t.add_column(name, justify="right")
    checkpoints = ", ".join(f"{k} {v}" for k, v in sorted(c["checkpoints"].items())) or "-"
    misses = ", ".join(f"{k} {v}" for k, v in sorted(c.get("misses", {}).items())) or "-"
    t.add_row(
        str(c["entries"]),
        str(c["anchors"]),
        checkpoints,
        str(c["disk_entries"]),
        f"{c['evictions']} / {c['disk_evictions']}",
        misses,
    )
    return t


def _anchors(snap: dict):
    from rich.table import Table

    t = Table(title="anchors", expand=True)
    for name in ("id", "namespace", "tokens", "bytes", "sessions"):
        t.add_column(name, justify="right")
    for a in snap["anchors"]:
        t.add_row(
            str(a["entry_id"]),
            a["namespace"] or "-",
            str(a["length"]),
            format_bytes(a["nbytes"]),
            str(a["sessions"]),
        )
    return t


def _hits(snap: dict):
    from rich.table import Table

    t = Table(title=f"restores over the last {snap['window_s']:.0f} s", expand=True)
    for name in ("restore kind", "requests", "cached / prompt tokens", "hit rate"):
        t.add_column(name, justify="left" if name == "restore kind" else "right")
    total = sum(k["requests"] for k in snap["window"]) or 1
    for k in snap["window"]:
        cached = k["cached_tokens"] / k["prompt_tokens"] if k["prompt_tokens"] else 0.0
        t.add_row(
            k["kind"],
            f"{k['requests']} ({k['requests'] / total:.0%})",
            f"{k['cached_tokens']} / {k['prompt_tokens']}",
            f"{cached:.1%}",
        )
    return t


def _requests(snap: dict):
    from rich.table import Table

    t = Table(title="latest requests", expand=True)
    cols = ("request", "replica", "ns", "finish", "restore", "prompt", "cached", "out")
    for name in cols + ("queue", "TTFT", "prefill", "tok/s", "miss"):
        t.add_column(name, justify="left" if name in cols[:5] + ("miss",) else "right")
    for r in snap["recent"]:
        tm = r["timing"]
        t.add_row(
            r["request_id"][:12],
            r["replica"] or "-",
            r["namespace"] or "-",
            r["finish_reason"],
            r["restore_kind"],
            str(r["prompt_tokens"]),
            str(r["cached_tokens"]),
            str(r["completion_tokens"]),
            f"{tm['queue_ms']:.0f} ms",
            f"{tm['ttft_ms']:.0f} ms",
            f"{tm['prefill_ms']:.0f} ms",
            f"{tm['decode_tps']:.1f}",
            miss_text(r),
        )
    return t


def miss_text(record: dict) -> str:
    """`kind@token m<message>` (head: before the first message), or - when it did not miss."""
    if not record.get("miss_kind"):
        return "-"
    message = record["miss_message"]
    where = f"m{message}" if message >= 0 else "head"
    return f"{record['miss_kind']}@{record['miss_token']} {where}"


def render(snap: dict, server: str):
    """One frame of `lineage top` (a rich Panel) from an Inspect reply as a dict."""
    from rich.console import Group
    from rich.panel import Panel

    body = Group(
        _replicas(snap),
        _cache(snap),
        _tiers(snap),
        *([_disk(snap)] if any(_has_disk(r) for r in snap["replicas"]) else []),
        _anchors(snap),
        _hits(snap),
        _requests(snap),
    )
    return Panel(body, title=f"lineage top  {server}  {time.strftime('%H:%M:%S')}")


def run(args: argparse.Namespace, console=None) -> int:
    """Frames until Ctrl-C (`--once`: one). `console`: a rich Console (default stdout)."""
    from rich.console import Console

    console = console or Console()
    with Client(args.server, **getattr(args, "connect", {})) as client:
        if args.once:
            console.print(render(client.inspect(args.requests, args.model), args.server))
            return 0
        from rich.live import Live

        with Live(console=console, screen=False, auto_refresh=False) as live:
            while True:
                snap = client.inspect(args.requests, args.model)
                live.update(render(snap, args.server), refresh=True)
                time.sleep(args.interval)
