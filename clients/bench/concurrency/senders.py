"""The concurrency benchmark's senders: one request as the client saw it (`Sent`), sent to
our engine (`EngineSender`: a BackgroundEngine in this process, through Client) or to a
peer server (`PeerSender`: clients.bench.peers, through its OpenAI API).

Knows how to send and time one request; nothing about traffic or figures. Cheap to
import: the engine loads inside the sender.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from engine.config import ModelConfig

# The peer runs of the benchmark, by the peer server each drives (clients.bench.peers).
PEER_RUNS = {
    "mlx_lm_server": "mlx_lm.server",
    "mlx_vlm": "mlx_vlm.server",
    "rapid_mlx": "rapid_mlx",
}


@dataclass
class Sent:
    """One request as the client saw it (perf_counter times)."""

    key: str
    kind: str  # warm | cold
    t_send: float
    t_first: float | None = None
    t_end: float = 0.0
    chunk_times: list = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    completed: bool = True  # false: dropped by the client mid-stream

    @property
    def ttft_ms(self) -> float:
        return ((self.t_first or self.t_end) - self.t_send) * 1000


# ---------------------------------------------------------------- senders ----


class EngineSender:
    """Our engine, in this process, on a fresh cache directory, driven through Client."""

    def __init__(
        self,
        opts,
        schedule: str,
        group: int,
        cache_dir: str,
        wait_bound: float | None = None,
        chunk_max: int | None = None,
        flight_wait: float | None = None,
        fixed_share: float | None = None,
    ):
        from clients.bench.harness import bench_kernels
        from clients.client import Client
        from engine.config import CacheConfig, EngineConfig, ServerConfig
        from engine.server.running.background import BackgroundEngine

        model = ModelConfig(
            path=opts.model,
            prefill_step_size=opts.prefill_step_size,
            schedule=schedule,
            prefill_budget=opts.prefill_budget,
            prefill_group=group,
            prefill_step_factor=opts.step_factor,
            prefill_slice_ms=opts.slice_ms,
            prefill_overlap=opts.overlap,
            prefill_eval=opts.prefill_eval,
            prefill_wait_bound=opts.wait_bound if wait_bound is None else wait_bound,
            prefill_chunk_max=opts.chunk_max if chunk_max is None else chunk_max,
        )
        if fixed_share is not None:
            model = dataclasses.replace(model, prefill_growth=1 / fixed_share)
        config = EngineConfig(
            model=model,
            cache=CacheConfig(cache_dir=cache_dir),
            server=ServerConfig(port=0)
            if flight_wait is None
            else ServerConfig(port=0, flight_wait=flight_wait),
            kernels=bench_kernels(),
        )
        self.engine = BackgroundEngine(config, timeout=600)
        self.client = Client(self.engine.address, timeout=600)

    def send(
        self, key, kind, messages=None, tools=None, prompt_ids=None, max_tokens=32, drop_after=0,
        namespace=None,
    ) -> Sent:  # fmt: skip
        """One request; its cache namespace `namespace`, else `cold` for a cold prompt (kept
        apart from the lanes' prefix) and the default for the rest."""
        from clients.client import Chunk, Final

        if namespace is None:
            namespace = "cold" if kind == "cold" else ""
        sent = Sent(key, kind, time.perf_counter())
        stream = self.client.stream(
            messages=messages, tools=list(tools) if tools else None, prompt_ids=prompt_ids,
            max_tokens=max_tokens, temperature=0.0, namespace=namespace,
        )  # fmt: skip
        for event in stream:
            if isinstance(event, Chunk) and event.ids:
                now = time.perf_counter()
                sent.t_first = sent.t_first or now
                sent.chunk_times.append(now)
                sent.text += event.text
                if drop_after and len(sent.chunk_times) >= drop_after:
                    stream.cancel()  # the client drops the call mid-stream
                    sent.completed = False
                    break
            elif isinstance(event, Final):
                sent.prompt_tokens = event.usage.prompt_tokens
                sent.cached_tokens = event.usage.cached_tokens
        sent.t_end = time.perf_counter()
        return sent

    def step_profile(self, since: float, until: float) -> dict:
        """The model loop's steps by phase between two perf_counter readings (same machine)."""
        return self.engine.step_profile(since, until)

    def prefill_log(self, since: float, until: float) -> dict:
        """The model loop's prefill log (per request: queued, chunks, between them; the chunk
        cost fit) for requests received between two perf_counter readings."""
        return self.engine.prefill_log(since, until)

    def close(self) -> None:
        self.client.close()
        self.engine.stop()


class PeerSender:
    """A peer server in a subprocess (clients.bench.peers); `reason` when it cannot run."""

    def __init__(self, opts, name: str):
        from clients.bench.peers import start_or_reason

        self.server, self.reason = start_or_reason(PEER_RUNS[name], opts.model)

    def send(
        self, key, kind, messages=None, tools=None, prompt_ids=None, max_tokens=32, drop_after=0,
        namespace=None,
    ) -> Sent:  # fmt: skip
        """One request (a peer has one cache: `namespace` is ours alone)."""
        reply = self.server.stream(messages, tools, max_tokens, drop_after)
        return Sent(
            key, kind, reply.t_send, reply.t_first, reply.t_end, reply.chunk_times,
            reply.prompt_tokens, reply.cached_tokens, reply.text, reply.completed,
        )  # fmt: skip

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
