"""`lineage bench slowloris`: slow connections to the bridge while agents work through it.

It starts Ray of its own, a real engine on the embedded model (or `--model`)
and the OpenAI bridge on the engine's own event loop, as `lineage serve
--http-port` runs it. Agents (`--agents`, a shared system prompt with tools,
conversations of `--turns` turns, replies streamed) talk to the bridge over
HTTP for `--duration` seconds a phase. Three phases, each with conversations
of its own:

1. the agents alone;
2. the agents while another process holds `--slow` slow connections to the
   bridge: most send their request headers a byte every `--drip` seconds,
   `--slow-bodies` of them send whole headers and then their body that slowly;
   each one the bridge cuts (header deadline, 408 at the body deadline) is
   opened again at once, so the count holds. The agents start once the first
   slow connections have been cut and opened again;
3. the agents alone again (the machine may drift over a run).

Figures: each phase's time to first token (the client's: request sent to the
first streamed content) p50 and p90, the slow phase's against the mean of the
two phases alone, failed requests, and what became of the slow connections
(opened, cut while sending headers, answered 408, most open at once) and the
CPU time their process took, on the engine's machine.
Exit status 1 when an agent's request failed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import os
import time

from clients.bench.figures import emit, labelled, percentile
from clients.bench.harness import add_engine_arguments, cache_dir, kernel_set, own_ray

HELP = "slow clients: slow connections to the bridge while agents run, TTFT beside none"


def add_arguments(parser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--agents", type=int, default=4, help="agents at once")
    parser.add_argument("--turns", type=int, default=6, help="turns per conversation")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per phase")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument("--system-tokens", type=int, default=1500, help="shared prefix length")
    parser.add_argument("--slow", type=int, default=500, help="slow connections held")
    parser.add_argument("--slow-bodies", type=int, default=50, help="of them, slow bodies")
    parser.add_argument("--drip", type=float, default=1.0, help="seconds between their bytes")
    parser.add_argument("--header-deadline", type=float, default=10.0, help="the bridge's")
    parser.add_argument("--body-deadline", type=float, default=30.0, help="the bridge's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    from clients.bridge.server import bridge_security, start_bridge
    from engine.config import EngineConfig
    from engine.server.running.background import BackgroundEngine

    with (
        cache_dir(args.cache_dir, "slowloris") as cache,
        cache_dir(None, "slowloris-sock") as private,
    ):
        flags = {"model": args.model, "cache_dir": str(cache), "kernels": kernel_set()}
        config = EngineConfig.from_sources(flags, {})
        config = config.with_server(
            port=0,
            ray_namespace=f"lineage-slowloris-{os.getpid()}",
            http_header_deadline=args.header_deadline,
            http_body_deadline=args.body_deadline,
        )
        socket_path = str(private / "grpc.sock")
        with own_ray():
            engine = BackgroundEngine(config, local_socket=socket_path)
            try:
                security = bridge_security(config.server, config.limits)
                bridge = engine.call(start_bridge(f"unix:{socket_path}", "127.0.0.1", 0, security))
                try:
                    figures = asyncio.run(_phases(bridge.url, bridge.port, args))
                finally:
                    engine.call(bridge.stop(grace=1.0))
            finally:
                engine.stop()
    emit(figures, args, lambda f: report(f, args))
    return 0 if figures["failed"] == 0 else 1


async def _phases(url: str, port: int, args) -> dict:
    out: dict = {"load_average": os.getloadavg()[0]}
    await _agents(url, args, seed=args.seed + 100, duration=0)  # warm-up: one turn each
    out["alone"] = await _agents(url, args, seed=args.seed)
    stop, report = multiprocessing.get_context("spawn").Event(), None
    queue = multiprocessing.get_context("spawn").Queue()
    slow = multiprocessing.get_context("spawn").Process(
        target=slow_clients,
        args=(port, args.slow, args.slow_bodies, args.drip, stop, queue),
        daemon=True,
    )
    slow.start()
    try:
        # Every slow connection open, and the first ones cut and opened again.
        await asyncio.sleep(max(5.0, args.drip * 3, args.header_deadline + 2))
        out["slow"] = await _agents(url, args, seed=args.seed + 1)
    finally:
        stop.set()
        report = await asyncio.to_thread(queue.get, True, 60)
        slow.join(30)
    out["alone_after"] = await _agents(url, args, seed=args.seed + 2)
    out["slow_connections"] = report
    out["failed"] = sum(out[p]["failed"] for p in ("alone", "slow", "alone_after"))
    alone = [out["alone"], out["alone_after"]]
    for q in ("p50", "p90"):
        base = sum(p[f"ttft_{q}_ms"] for p in alone) / 2
        out[f"ratio_{q}"] = out["slow"][f"ttft_{q}_ms"] / base if base else 0.0
    return out


async def _agents(url: str, args, seed: int, duration: float | None = None) -> dict:
    """The agents' conversations, all at once, until `duration` (at least one turn each);
    their TTFTs and failures."""
    import httpx

    from clients.fanout import make_shared_prefix, user_message

    system, tools = make_shared_prefix(args.system_tokens, seed=args.seed)
    ttfts, failed = [], []
    end = time.monotonic() + (args.duration if duration is None else duration)

    async def agent(http, k: int) -> None:
        for turn in itertools.count():
            if turn and time.monotonic() >= end:
                return
            if turn % args.turns == 0:  # a new conversation
                intro = f"{system}\nYou are agent {k}, run {seed}, task {turn // args.turns}."
                messages = [{"role": "system", "content": intro}]
            messages.append({"role": "user", "content": user_message(k, turn, seed)})
            body = {
                "model": "m",
                "messages": messages,
                "tools": tools,
                "max_tokens": args.max_tokens,
                "temperature": 0.0,
                "stream": True,
            }
            t0, first, text = time.perf_counter(), None, ""
            try:
                async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        for choice in json.loads(line[6:]).get("choices", ()):
                            piece = (choice.get("delta") or {}).get("content") or ""
                            if piece and first is None:
                                first = time.perf_counter()
                            text += piece
            except httpx.HTTPError as error:
                failed.append(f"{type(error).__name__}: {error}"[:200])
                return
            ttfts.append(((first or time.perf_counter()) - t0) * 1000)
            messages.append({"role": "assistant", "content": text})

    async with httpx.AsyncClient(timeout=300) as http:
        t0 = time.monotonic()
        await asyncio.gather(*(agent(http, k) for k in range(args.agents)))
        wall = time.monotonic() - t0
    return {
        "requests": len(ttfts) + len(failed),
        "failed": len(failed),
        "failures": failed[:3],
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p90_ms": percentile(ttfts, 90),
        "wall_s": wall,
    }


def slow_clients(port: int, count: int, bodies: int, drip: float, stop, queue) -> None:
    """In a process of its own: hold `count` slow connections until `stop`; then put what
    became of them on `queue`."""
    stats = {"opened": 0, "cut_in_headers": 0, "answered_408": 0, "answered_other": 0}
    stats.update(open_max=0, refused=0)
    cpu0, wall0 = time.process_time(), time.monotonic()
    live = [0]

    async def one(k: int) -> None:
        body = k < bodies
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                stats["refused"] += 1
                await asyncio.sleep(drip)
                continue
            stats["opened"] += 1
            live[0] += 1
            stats["open_max"] = max(stats["open_max"], live[0])
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            if body:  # whole headers, then the body a byte at a time
                head += b"Content-Type: application/json\r\nContent-Length: 99999\r\n\r\n"
            writer.write(head)
            drips = b'{"messages": [' + b" " * 10**6 if body else b"X-Slow: " + b"a" * 10**6
            answer = b""
            try:
                for i in range(len(drips)):
                    if stop.is_set():
                        break
                    writer.write(drips[i : i + 1])
                    await writer.drain()
                    try:
                        answer = await asyncio.wait_for(reader.read(64), drip)
                    except asyncio.TimeoutError:
                        continue
                    break  # an answer, or the end of the connection
            except (ConnectionError, OSError):
                answer = b""
            live[0] -= 1
            writer.close()
            if stop.is_set():
                break
            if answer.startswith(b"HTTP/1.1 408"):
                stats["answered_408"] += 1
            elif answer:
                stats["answered_other"] += 1
            else:
                stats["cut_in_headers" if not body else "answered_other"] += 1

    async def main() -> None:
        await asyncio.gather(*(one(k) for k in range(count)))

    asyncio.run(main())
    # The CPU they took: on one machine, the engine's cores pay for the attack too.
    stats.update(cpu_s=time.process_time() - cpu0, wall_s=time.monotonic() - wall0)
    queue.put(stats)


def report(f: dict, args) -> str:
    s = f["slow_connections"] or {}

    def phase(p: dict) -> str:
        return (
            f"TTFT p50 {p['ttft_p50_ms']:.0f} ms, p90 {p['ttft_p90_ms']:.0f} ms "
            f"({p['requests']} requests, {p['failed']} failed, {p['wall_s']:.1f} s)"
        )

    lines = labelled(
        [
            ("agents alone", phase(f["alone"])),
            (f"with {args.slow} slow", phase(f["slow"])),
            ("alone again", phase(f["alone_after"])),
            ("slow / alone", f"p50 {f['ratio_p50']:.2f}x, p90 {f['ratio_p90']:.2f}x"),
            (
                "slow connections",
                f"opened {s.get('opened', 0)}, most open at once {s.get('open_max', 0)}, "
                f"cut in their headers {s.get('cut_in_headers', 0)}, "
                f"408 {s.get('answered_408', 0)}, other {s.get('answered_other', 0)}, "
                f"refused {s.get('refused', 0)}; their process took "
                f"{s.get('cpu_s', 0):.1f} s of CPU in {s.get('wall_s', 0):.0f} s",
            ),
        ],
        width=18,
        indent="  ",
    )
    return "\n".join(
        [
            f"{args.agents} agents, {args.duration:g} s a phase, through the bridge (shared loop); "
            f"{args.slow} slow connections ({args.slow_bodies} slow bodies), a byte every "
            f"{args.drip:g} s; header deadline {args.header_deadline:g} s, body deadline "
            f"{args.body_deadline:g} s; load average {f['load_average']:.2f} at the start",
            *lines,
        ]
    )
