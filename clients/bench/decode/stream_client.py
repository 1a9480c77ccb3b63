"""Streaming clients for `bench decode`, run in a process of their own.

`python -m clients.bench.decode.stream_client http URL --prompts 0,3,5 --tokens N` sends
one greedy streaming completion per prompt, all at once, to an OpenAI-compatible server (ours
through its bridge, or `mlx_lm.server`: the same client for both), and
`... grpc ADDRESS ...` the same through our gRPC client library. Each stream
records when its chunks arrived and how many tokens it got; the JSON on
stdout is a list of streams. A process of its own, so the client's CPU is
not the server's: the benchmark counts every other process's.

Standard library plus the client library; no MLX, no Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field


@dataclass
class Stream:
    """One streamed completion as the client saw it (`time.perf_counter` seconds)."""

    sent: float
    first: float = 0.0
    last: float = 0.0
    tokens: int = 0
    chunks: int = 0
    chunk_times: list = field(default_factory=list)
    error: str = ""


def prompt_text(index: int) -> str:
    """A raw prompt of some 60 tokens, different for each stream (no chat template: a reply
    rarely meets the end-of-text token, so every server decodes the same long reply)."""
    words = "the model decodes each token of a long reply while the others wait".split()
    line = " ".join(words[(index + k) % len(words)] for k in range(len(words)))
    return f"# stream {index}\n" + "\n".join([line] * 4) + "\n"


# ------------------------------------------------------------------ HTTP ----


def http_stream(
    url: str, index: int, max_tokens: int, model: str, out: list, slot: int, chat: bool = False
) -> None:
    """One streaming /v1/completions call of prompt `index` (greedy, usage included) into
    `out[slot]`; no model named unless `model` (each server serves the one it loaded). With
    `chat`, /v1/chat/completions with the prompt as the user's message (for a server that
    has no raw completions)."""
    parts = urllib.parse.urlsplit(url)
    text = prompt_text(index)
    body = {
        **({"model": model} if model else {}),
        **({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    s = Stream(sent=time.perf_counter())
    out[slot] = s
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions" if chat else "/v1/completions",
            json.dumps(body),
            {"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        if response.status != 200:
            s.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            event = json.loads(data)
            usage = event.get("usage")
            if usage:
                s.tokens = int(usage.get("completion_tokens", 0))
            if any(_text(c) for c in event.get("choices", ())):
                now = time.perf_counter()
                s.first = s.first or now
                s.last = now
                s.chunks += 1
                s.chunk_times.append(now)
    except OSError as error:
        s.error = f"{type(error).__name__}: {error}"
    finally:
        conn.close()
        s.tokens = s.tokens or s.chunks  # a server that sends no usage: one token a chunk


def _text(choice: dict) -> str:
    """A completion chunk's text, or a chat chunk's (content or reasoning)."""
    delta = choice.get("delta") or {}
    return choice.get("text") or delta.get("content") or delta.get("reasoning") or ""


def run_http(
    url: str, prompts: list[int], max_tokens: int, model: str, chat: bool = False
) -> list[Stream]:
    out: list = [None] * len(prompts)
    threads = [
        threading.Thread(target=http_stream, args=(url, p, max_tokens, model, out, i, chat))
        for i, p in enumerate(prompts)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# ------------------------------------------------------------------ gRPC ----


async def grpc_stream(client, index: int, max_tokens: int) -> Stream:
    from clients.client import Chunk, Final

    s = Stream(sent=time.perf_counter())
    try:
        async for event in client.stream(
            prompt=prompt_text(index), max_tokens=max_tokens, temperature=0.0
        ):
            if isinstance(event, Chunk) and event.ids:
                now = time.perf_counter()
                s.first = s.first or now
                s.last = now
                s.chunks += 1
                s.tokens += len(event.ids)
                s.chunk_times.append(now)
            elif isinstance(event, Final):
                s.tokens = event.usage.completion_tokens
    except Exception as error:  # reported, not raised: the other streams' figures stand
        s.error = f"{type(error).__name__}: {error}"
    return s


async def run_grpc(address: str, prompts: list[int], max_tokens: int) -> list[Stream]:
    from clients.client import AsyncClient

    client = AsyncClient(address)
    try:
        return list(await asyncio.gather(*(grpc_stream(client, p, max_tokens) for p in prompts)))
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clients.bench.decode.stream_client")
    p.add_argument("protocol", choices=("http", "grpc"))
    p.add_argument("address", help="http://host:port, or host:port for gRPC")
    p.add_argument("--prompts", default="0", help="comma-separated prompt indexes, one stream each")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--model", default="", help="the HTTP body's model name (default: none)")
    p.add_argument("--chat", action="store_true", help="HTTP: /v1/chat/completions")
    args = p.parse_args(argv)
    prompts = [int(i) for i in args.prompts.split(",")]
    if args.protocol == "http":
        result = run_http(args.address, prompts, args.tokens, args.model, args.chat)
    else:
        result = asyncio.run(run_grpc(args.address, prompts, args.tokens))
    json.dump([asdict(s) for s in result], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
