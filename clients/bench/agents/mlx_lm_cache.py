"""mlx-lm's own server prompt cache as a policy of `lineage bench agents`, in this process.

`MlxLmPromptCache` holds the model and mlx-lm's `LRUPromptCache` (same byte
budget as ours, mlx_lm.server's entry count) and serves a step of the traffic
as mlx_lm.server's batch path does: every request fetches at admission (the
batch server admits them together), then each is served in turn: the system
segment is prefilled and stored ("system") when the prompt has one and the
fetch did not cover it, the rest is prefilled, the reply decoded greedily,
and the cache inserted under the tokens it holds (prompt + completion minus
the last, unfed token). A dropped stream stores nothing more (the server
removes it without its cache). An exact hit leaves no token to compute; the
batch server would refuse it, so it is served cold.

It knows mlx-lm's cache through two of its private parts (`_lru`, to count
evictions; `_trie`, to name what a fetch will use). Cheap to import: MLX and
mlx-lm load in the constructor.
"""

from __future__ import annotations

import copy
import time
from typing import Callable, Iterator

from clients.bench.agents.observed import Observed

MLX_LM_ENTRIES = 10  # mlx_lm.server --prompt-cache-size default


class MlxLmPromptCache:
    """The model and its LRUPromptCache; `serve` a step, `sample` the cache figures."""

    def __init__(self, model_dir: str, ram_budget: int, step: int):
        import mlx_lm
        from mlx_lm.models.cache import LRUPromptCache

        self.model, self.tokenizer = mlx_lm.load(model_dir)
        self.eos = {int(t) for t in self.tokenizer.eos_token_ids}
        self.step = step
        self.key = (model_dir, None, None)
        self.lru = LRUPromptCache(max_size=MLX_LM_ENTRIES, max_bytes=ram_budget)
        self.evictions = 0
        pop = self.lru._lru.pop

        def counted_pop():  # CacheOrder.pop runs for evictions only
            self.evictions += 1
            return pop()

        self.lru._lru.pop = counted_pop

    def serve(self, batch: list, system_end: Callable) -> Iterator[tuple[Observed, str]]:
        """(Observed, reply text) per (spec, messages, prompt ids) of the step, in order.
        `system_end(messages, prompt)`: where mlx_lm.server's system segment ends (0: none)."""
        admitted = [self._admit(prompt.tolist()) for _, _, prompt in batch]
        for (spec, messages, prompt), (cache, rest, kind, fetch_s) in zip(batch, admitted):
            t = time.perf_counter()
            cached = len(prompt) - len(rest)
            end = system_end(messages, prompt)
            if cached < end:
                self._prefill(cache, prompt[cached:end].tolist())
                self.lru.insert_cache(
                    self.key, prompt[:end].tolist(), copy.deepcopy(cache), cache_type="system"
                )
                rest = prompt[end:].tolist()
            got, first_at = self._decode(cache, rest, spec.drop_after or spec.max_tokens)
            done = not spec.drop_after or got[-1] in self.eos
            if done:
                tokens = prompt.tolist() + got[:-1]
                self.lru.insert_cache(self.key, tokens, cache, cache_type="assistant")
            reply = [g for g in got if g not in self.eos]
            ttft_ms = (fetch_s + first_at - t) * 1000
            ob = Observed(spec.rid, spec.step, spec.lane, spec.kind, prompt, reply, done)
            ob.cached, ob.restore, ob.restore_length, ob.ttft_ms = cached, kind, cached, ttft_ms
            yield ob, self.tokenizer.decode(reply)

    def sample(self) -> dict:
        return {
            "ram_bytes": self.lru.nbytes,
            "disk_bytes": 0,
            "disk_bytes_written": 0,
            "evictions": self.evictions,
        }

    def _admit(self, tokens: list) -> tuple:
        """The fetch at admission: (cache, tokens left to compute, kind, seconds it took)."""
        from mlx_lm.models.cache import make_prompt_cache

        t = time.perf_counter()
        kind = self._kind(tokens)
        cache, rest = self.lru.fetch_nearest_cache(self.key, tokens)
        if cache is None or not rest:
            cache, rest, kind = make_prompt_cache(self.model), tokens, "none"
        return cache, rest, kind, time.perf_counter() - t

    def _kind(self, tokens: list) -> str:
        """Which stored key fetch_nearest_cache will use, by its trie search and cache type."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        trie = self.lru._trie
        found = trie.search(self.key, tokens)
        if found.exact is not None:
            return "exact"
        short = len(found.shorter) if found.shorter is not None else 0
        longer = found.longer is not None and found.common_prefix > short
        if longer and can_trim_prompt_cache(trie.get(found.model, found.longer).prompt_cache):
            return "longer"
        if short:
            return "shorter:" + trie.get(found.model, found.shorter).cache_type
        return "none"

    def _prefill(self, cache, tokens: list) -> None:
        import mlx.core as mx

        for i in range(0, len(tokens), self.step):
            self.model(mx.array(tokens[i : i + self.step])[None], cache=cache)
            mx.eval([c.state for c in cache])

    def _decode(self, cache, rest: list, limit: int):
        """Prefill `rest` and decode greedily: (ids, perf_counter time of the first token)."""
        import mlx.core as mx

        self._prefill(cache, rest[:-1])
        y, got, first = rest[-1], [], 0.0
        for _ in range(limit):
            y = int(mx.argmax(self.model(mx.array([[y]]), cache=cache)[0, -1]).item())
            if not got:
                first = time.perf_counter()
            got.append(y)
            if y in self.eos:
                break
        return got, first
