"""mlx-lm's BatchGenerator, with the memory-pool clear per prefill chunk made opt-in.

mlx-lm's PromptProcessingBatch calls `mx.clear_cache()` after every prefill
chunk and after every padded batch. That hands MLX's buffer pool back to the
operating system, so the next allocation page-faults fresh memory: on a warm
turn it turned each KV copy into seconds (reference 000, "Where the other
second went"). Here the pool stays, bounded by MLX's cache limit, and is
released when the engine goes idle; the per-chunk clear is a config flag.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch, _right_pad_prompts


class PoolClearCounter:
    """Counts the pool clears the batch makes (the tests read it)."""

    def __init__(self):
        self.count = 0

    def clear(self) -> None:
        self.count += 1
        mx.clear_cache()


class LineagePromptBatch(PromptProcessingBatch):
    """PromptProcessingBatch whose per-chunk pool clear happens only when asked."""

    clear_pool: bool = False
    pool: PoolClearCounter | None = None
    layer_timer = None  # set by the generator: callable(chunk_len) -> context manager

    def _copy(self):
        new = super()._copy()
        new.clear_pool, new.pool, new.layer_timer = self.clear_pool, self.pool, self.layer_timer
        return new

    def prompt(self, tokens):
        """Run the prompt tokens through the model (mlx-lm's loop, minus the forced clears)."""
        if len(self.uids) != len(tokens):
            raise ValueError("The batch length doesn't match the number of inputs")
        if not tokens:
            return
        for sti, ti in zip(self.tokens, tokens):
            sti += ti
        lengths = [len(p) for p in tokens]
        max_length = max(lengths)
        padding = [max_length - n for n in lengths]
        if max(padding) > 0:
            tokens = _right_pad_prompts(tokens, max_length=max_length)
            for c in self.prompt_cache:
                c.prepare(lengths=lengths, right_padding=padding)
        else:
            tokens = mx.array(tokens)
        while tokens.shape[1] > 0:
            n = min(self.prefill_step_size, tokens.shape[1])
            self.model(tokens[:, :n], cache=self.prompt_cache)
            mx.eval([c.state for c in self.prompt_cache])
            self._maybe_clear()
            tokens = tokens[:, n:]
        if max(padding) > 0:
            for c in self.prompt_cache:
                c.finalize()
            mx.eval([c.state for c in self.prompt_cache])
            self._maybe_clear()

    def _maybe_clear(self) -> None:
        if self.clear_pool and self.pool is not None:
            self.pool.clear()


class LineageBatchGenerator(BatchGenerator):
    """BatchGenerator with the opt-in pool clear; everything else is mlx-lm's."""

    def __init__(self, model, *, clear_pool_per_prefill: bool = False, **kwargs):
        super().__init__(model, **kwargs)
        self.pool = PoolClearCounter()
        batch = LineagePromptBatch.empty(
            self.model, self.sampler, prefill_step_size=self.prefill_step_size
        )
        batch.clear_pool = clear_pool_per_prefill
        batch.pool = self.pool
        self._prompt_batch = batch
