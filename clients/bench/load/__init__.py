"""`lineage bench load`: many sessions on a small RAM budget, then a burst past the queue.

It starts Ray of its own and a real engine (actors, gRPC on a free port) on
the embedded model (or `--model`), with a small RAM budget and a small queue,
in a cache directory of its own (a temporary one unless `--cache-dir`):

1. `--sessions` concurrent sessions run multi-turn conversations (a shared
   system prompt and tools, `--turns` turns each, then a new conversation)
   for `--duration` seconds. Figures: requests and errors (every failed call
   counts), time to first token (seen by the client) p50/p99, decode tokens/s
   (per request, from the Final event, and all completion tokens over the wall
   time), and the RAM held against the budget: the most the RAM tier held
   (its peak after every change, kept by the model actor, and the most seen
   sampling it every 0.25 s), the most held aside by finished requests
   waiting for their commit's Orders (sampled), and the model actor
   process's peak RSS against the memory limit.
2. A burst of `--burst` requests at once, more than the queue holds. Every
   one must be answered, served or RESOURCE_EXHAUSTED, within `--deadline`
   seconds: the figures count served, refused, other errors and hung.

Exit status 1 when phase 1 saw an error, the RAM tier went past its budget,
or a burst request was lost or hung.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from clients.bench.figures import emit, labelled, median, percentile
from clients.bench.harness import add_engine_arguments, cache_dir, kernel_set, own_ray

HELP = "load: concurrent sessions on a small RAM budget, then a burst past the queue"
MB = 1 << 20


def add_arguments(parser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument("--duration", type=float, default=120.0, help="phase 1 seconds")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per reply")
    parser.add_argument("--system-tokens", type=int, default=1500, help="shared prefix length")
    parser.add_argument("--ram-budget", default="24M", help="the RAM tier's budget (small)")
    parser.add_argument("--max-queue", type=int, default=64, help="requests in flight")
    parser.add_argument("--burst", type=int, default=300, help="requests sent at once")
    parser.add_argument("--deadline", type=float, default=300.0, help="per request seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    from engine.config import EngineConfig, parse_bytes
    from engine.server.running.background import BackgroundEngine

    with cache_dir(args.cache_dir, "load") as cache:
        flags = {"model": args.model, "cache_dir": str(cache), "ram_budget": args.ram_budget}
        flags["kernels"] = kernel_set()
        config = EngineConfig.from_sources(flags, {}).with_model(max_queue=args.max_queue)
        config = config.with_server(port=0, ray_namespace=f"lineage-load-{os.getpid()}")
        with own_ray(logs=True):
            engine = BackgroundEngine(config)
            try:
                figures = {
                    "ram_budget": parse_bytes(args.ram_budget),
                    "memory_limit": engine.engine.memory.limit,
                    "max_batch_tokens": engine.engine.memory.max_batch_tokens,
                    "max_queue": args.max_queue,
                }
                timeout = args.duration + 4 * 3600
                figures.update(engine.call(_phases(engine, args), timeout=timeout))
            finally:
                engine.stop()
    emit(figures, args, lambda f: report(f, args))
    ok = (
        figures["errors"] == 0
        # The exact peak (after every change); the 0.25 s sample cannot exceed it.
        and figures["ram_tier_peak"] <= figures["ram_budget"]
        and figures["burst_lost"] == 0
    )
    return 0 if ok else 1


async def _phases(engine, args) -> dict:
    from clients.client import AsyncClient

    async with AsyncClient(engine.address, timeout=60) as client:
        await client.wait_ready(60)
        sampler = asyncio.ensure_future(_sample(engine))
        try:
            one = await _sessions(client, args)
        finally:
            sampler.cancel()
        held = await _settled(sampler)
        two = await _burst(client, args)
    return {**one, **held, **two}


async def _sessions(client, args) -> dict:
    """Phase 1: the sessions until the duration is up; per-request figures."""
    from clients.fanout import make_shared_prefix, user_message

    system, tools = make_shared_prefix(args.system_tokens, seed=args.seed)
    ttfts, tps, errors, tokens = [], [], [], 0
    end = time.monotonic() + args.duration
    t0 = time.monotonic()

    async def session(k: int) -> None:
        nonlocal tokens
        rng, convo = random.Random(args.seed * 1000 + k), 0
        while time.monotonic() < end:
            msgs = [{"role": "system", "content": system}]
            for turn in range(args.turns):
                if time.monotonic() >= end:
                    return
                msgs.append({"role": "user", "content": user_message(k * 100 + convo, turn)})
                sent = time.monotonic()
                first, reply = None, None
                try:
                    stream = client.stream(
                        messages=msgs,
                        tools=tools,
                        max_tokens=args.max_tokens,
                        namespace=f"s{k}",
                        seed=rng.randrange(1 << 30),
                    )
                    async with asyncio.timeout(args.deadline):
                        async for event in stream:
                            if first is None and getattr(event, "ids", None):
                                first = time.monotonic()
                        reply = await stream.result()
                except Exception as e:  # every failed call is an error of the run
                    errors.append(f"{type(e).__name__}: {e}")
                    break
                if first is not None:
                    ttfts.append((first - sent) * 1000)
                if reply.timing.decode_tps:
                    tps.append(reply.timing.decode_tps)
                tokens += reply.usage.completion_tokens
                msgs.append({"role": "assistant", "content": reply.text})
            convo += 1

    await asyncio.gather(*(session(k) for k in range(args.sessions)))
    wall = time.monotonic() - t0
    return {
        "requests": len(ttfts) + len(errors),
        "errors": len(errors),
        "error_samples": errors[:3],
        "ttft_p50_ms": median(ttfts),
        "ttft_p99_ms": percentile(ttfts, 99),
        "decode_tps_per_request": median(tps),
        "completion_tokens_per_s": tokens / wall if wall else 0.0,
        "wall_s": wall,
    }


async def _sample(engine, every: float = 0.25):
    """Track the RAM tier's bytes and the model actor's RSS until cancelled."""
    import ray

    model = engine.engine.model
    state = dict.fromkeys(_HELD, 0)
    try:
        while True:
            try:
                stats = await asyncio.wait_for(model.generator_stats.remote(), 30)
                hello = await asyncio.wait_for(model.hello.remote(5.0), 30)
                seen = (stats.ram_bytes, stats.ram_peak_bytes, stats.staged_bytes, _rss(hello.pid))
                for key, value in zip(_HELD, seen):
                    state[key] = max(state[key], value)
            except (asyncio.TimeoutError, ray.exceptions.RayActorError):
                pass
            await asyncio.sleep(every)
    except asyncio.CancelledError:
        return state


_HELD = ("ram_tier_max", "ram_tier_peak", "staged_max", "model_rss_max")


async def _settled(sampler: asyncio.Future) -> dict:
    try:
        return await sampler
    except asyncio.CancelledError:
        return dict.fromkeys(_HELD, 0)


def _rss(pid: int) -> int:
    """The resident set of a process of this machine, in bytes (0 when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _burst(client, args) -> dict:
    """Phase 2: `--burst` requests at once; each is served, refused, failed or hung."""
    from clients.wire import LineageError

    outcome: dict[str, int] = {"served": 0, "refused": 0, "failed": 0, "hung": 0}

    async def one(k: int) -> None:
        try:
            async with asyncio.timeout(args.deadline):
                await client.generate(
                    prompt_ids=[5 + k % 97, 17, 300 + k % 13, 42],
                    max_tokens=args.max_tokens,
                    namespace="burst",
                )
            outcome["served"] += 1
        except TimeoutError:
            outcome["hung"] += 1
        except LineageError as e:
            outcome["refused" if e.code == "RESOURCE_EXHAUSTED" else "failed"] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(one(k) for k in range(args.burst)))
    answered = outcome["served"] + outcome["refused"]
    return {
        "burst": args.burst,
        "burst_served": outcome["served"],
        "burst_refused": outcome["refused"],
        "burst_failed": outcome["failed"],
        "burst_hung": outcome["hung"],
        "burst_lost": args.burst - answered,
        "burst_wall_s": time.monotonic() - t0,
    }


def report(f: dict, args) -> str:
    budget = f["ram_budget"] or 1
    phase_one = labelled(
        [
            ("requests", f"{f['requests']}"),
            ("errors", f"{f['errors']}  {'; '.join(f['error_samples'])}"),
            ("TTFT p50 / p99", f"{f['ttft_p50_ms']:.0f} / {f['ttft_p99_ms']:.0f} ms"),
            ("decode tok/s", f"{f['decode_tps_per_request']:.1f} per request (median)"),
            ("completion tok/s", f"{f['completion_tokens_per_s']:.1f} (all sessions)"),
            (
                "RAM tier peak",
                f"{f['ram_tier_peak'] / MB:.2f} MB of {budget / MB:.0f} MB "
                f"({f['ram_tier_peak'] / budget:.4f}x the budget; after every change)",
            ),
            (
                "RAM tier max",
                f"{f['ram_tier_max'] / MB:.2f} MB "
                f"({f['ram_tier_max'] / budget:.4f}x; sampled every 0.25 s)",
            ),
            ("staged max", f"{f['staged_max'] / MB:.2f} MB (awaiting their commit's Orders)"),
            (
                "model actor RSS max",
                f"{f['model_rss_max'] / MB:.0f} MB (memory limit {f['memory_limit'] / MB:.0f} MB)",
            ),
        ],
        width=21,
        indent="  ",
    )
    return "\n".join(
        [
            f"phase 1: {args.sessions} sessions x {args.turns} turns for {f['wall_s']:.0f} s, "
            f"RAM budget {f['ram_budget'] / MB:.0f} MB, queue {f['max_queue']}, "
            f"batch tokens {f['max_batch_tokens']}",
            *phase_one,
            f"phase 2: burst of {f['burst']}: served {f['burst_served']}, "
            f"RESOURCE_EXHAUSTED {f['burst_refused']}, other errors {f['burst_failed']}, "
            f"hung {f['burst_hung']}, lost {f['burst_lost']} ({f['burst_wall_s']:.1f} s)",
        ]
    )
