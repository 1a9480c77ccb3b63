"""The model actor: a thin Ray shell over the Generator.

It owns the MLX model, the batch generator and the RAM tier of one replica,
and (lineage mode) the disk tier's writer thread, which writes entry files off
the loop thread. All MLX work runs on one loop thread; Ray calls reach it
through an inbox of callables, and events leave through per-request asyncio
queues that the streaming `generate` method drains (several events per Ray
yield, never one round trip per token).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import ray

from engine.config import EngineConfig
from engine.events import Finished, GenerationRequest
from engine.messages import Commit, Orders, Release

log = logging.getLogger(__name__)
IDLE_RELEASE_S = 2.0  # release MLX's buffer pool after this long without work


@dataclass(frozen=True)
class ModelInfo:
    path: str
    model_type: str
    vocab_size: int
    max_context: int
    fingerprint: str
    has_state_layers: bool
    eos_token_ids: tuple[int, ...]


def resolve_model_path(config: EngineConfig) -> Path:
    """The served model's directory; the embedded default is built on first use."""
    if config.model.path:
        path = Path(config.model.path).expanduser()
        if not (path / "config.json").exists():
            raise ValueError(
                f"--model {path}: no config.json there (not an mlx-lm model directory)"
            )
        return path
    from engine.tiny_models import ensure_default_model

    return ensure_default_model(config.cache.resolved_cache_dir)


def load_model(config: EngineConfig):
    """(model, tokenizer, ModelInfo) for the configured model."""
    import mlx_lm

    from engine import snapshot
    from engine.fingerprint import model_fingerprint

    path = resolve_model_path(config)
    model, tokenizer, raw = mlx_lm.load(str(path), return_config=True)
    kinds = [snapshot.layer_kind(c) for c in model.make_cache()]
    dtype = str(next(iter(v for _, v in _leaves(model.parameters()))).dtype)
    max_context = config.model.max_context or int(
        raw.get("max_position_embeddings") or raw.get("max_seq_len") or 32768
    )
    info = ModelInfo(
        path=str(path),
        model_type=str(raw.get("model_type", "")),
        vocab_size=int(raw.get("vocab_size") or len(tokenizer._tokenizer)),
        max_context=max_context,
        # The KV cache is the model dtype: mlx-lm's batch cannot merge a quantized
        # KV cache, so KV quantization is not offered (the fingerprint would key it).
        fingerprint=model_fingerprint(path, dtype),
        has_state_layers=any(k != "append" for k in kinds),
        eos_token_ids=tuple(sorted(int(t) for t in tokenizer.eos_token_ids)),
    )
    return model, tokenizer, info


def _leaves(tree):
    from mlx.utils import tree_flatten

    return tree_flatten(tree)


@ray.remote(num_cpus=0)
class ModelActor:
    def __init__(self, config: EngineConfig, manager=None, replica: int = 0):
        self.config = config
        self.manager = manager
        self.replica = replica
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.info_value: ModelInfo | None = None
        self.generator = None
        self.thread = threading.Thread(target=self._loop, name="model-loop", daemon=True)
        self.thread.start()
        self.ready.wait()
        if self.error is not None:
            raise self.error

    # ---- Ray API --------------------------------------------------------------

    def info(self) -> ModelInfo:
        return self.info_value

    def attach(self, manager) -> None:
        """The cache manager is built after the model (it needs the fingerprint)."""
        self.manager = manager

    async def generate(self, req: GenerationRequest):
        """Stream lists of events (Progress, Tokens, Finished) for one request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self.inbox.put(lambda g: g.submit(req, emit))
        finished = False
        try:
            while not finished:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                finished = any(isinstance(e, Finished) for e in batch)
                yield batch
        finally:
            if not finished:  # the consumer went away: free the slot
                self.inbox.put(lambda g: g.cancel(req.request_id))

    async def cancel(self, request_id: str) -> None:
        """Returns once the cancelled request's cache is committed (or released)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished() -> None:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        self.inbox.put(lambda g: g.cancel(request_id, finished))
        await done

    def apply_orders(self, orders: Orders) -> None:
        self.inbox.put(lambda g: g.apply_orders(orders))

    async def flush_disk(self, timeout: float = 60.0) -> bool:
        """Wait until every file ordered so far is written (call before killing the actor)."""
        store = self.generator.tier.disk if self.generator is not None else None
        if store is None:
            return True
        return await asyncio.to_thread(store.flush, timeout)

    def tier_stats(self) -> dict:
        """RAM tier, pool and disk writer figures, read on the loop thread."""
        done: queue.SimpleQueue = queue.SimpleQueue()

        def read(g) -> None:
            done.put(
                {
                    "entries": len(g.tier.entries),
                    "ram_bytes": g.tier.nbytes,
                    "active": len(g.active),
                    "pool_clears": g.bg.pool.count,
                    "disk": g.tier.disk.stats() if g.tier.disk is not None else None,
                }
            )

        self.inbox.put(read)
        return done.get(timeout=30)

    # ---- the loop thread -----------------------------------------------------------

    def _loop(self) -> None:
        try:
            model, tokenizer, self.info_value = load_model(self.config)
            from engine.generator import Generator
            from engine.store import RamTier

            self.generator = Generator(
                model,
                tokenizer,
                self.config,
                RamTier(self.info_value.has_state_layers, disk_store(self.config, self.info_value)),
                send_commit=self._send_commit,
                send_release=self._send_release,
                replica=self.replica,
                send_anchor=self._send_anchor,
            )
        except BaseException as e:  # reported by __init__
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        gen = self.generator
        idle_since: float | None = None
        while True:
            self._drain(block=not gen.busy)
            if not gen.busy:
                idle_since = idle_since or time.monotonic()
                if idle_since and time.monotonic() - idle_since > IDLE_RELEASE_S:
                    _release_pool()
                    idle_since = float("inf")
                continue
            idle_since = None
            try:
                gen.step()
            except Exception as e:  # a failed batch must not take the server down
                log.exception("batch step failed")
                gen.fail_all(f"{type(e).__name__}: {e}")

    def _drain(self, block: bool) -> None:
        try:
            fn = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                fn(self.generator)
            except Exception:
                log.exception("model actor call failed")
            try:
                fn = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _send_commit(self, commit: Commit, on_orders) -> None:
        self._ask_manager(self.manager.commit.remote(commit), on_orders, commit.request_id)

    def _send_anchor(self, anchor, on_orders) -> None:
        self._ask_manager(self.manager.commit_anchor.remote(anchor), on_orders, anchor.request_id)

    def _send_release(self, release: Release) -> None:
        self._ask_manager(self.manager.release.remote(release), None, release.request_id)

    def _ask_manager(self, ref, on_orders, request_id: str) -> None:
        """Hand the manager's Orders to the loop thread when they come (never blocks it).

        `on_orders` runs on the loop thread (default: apply them); a failed call
        is logged and answered with empty Orders, so a waiting request still ends.
        """

        def done(f) -> None:
            try:
                orders = f.result()
            except Exception:
                log.exception("cache manager call for %s failed", request_id)
                orders = Orders()
            self.inbox.put(lambda g: (on_orders or g.apply_orders)(orders))

        ref.future().add_done_callback(done)


def disk_store(config: EngineConfig, info: ModelInfo):
    """The disk tier's store (and writer thread) of this model, or None when it is off."""
    cache = config.cache
    if cache.mode == "off" or cache.disk_budget <= 0:
        return None
    from engine.disk import entries_dir
    from engine.store import DiskStore

    return DiskStore(entries_dir(cache.resolved_cache_dir, cache.mode), info.fingerprint)


def _release_pool() -> None:
    import mlx.core as mx

    mx.clear_cache()
