"""A machine's costs as the simulation charges them: prefill chunks, decode steps, snapshots.

The defaults are a Mac's, from one published account (GLM-5.3-Flash on a Mac
Studio M3 Ultra served by mlx-vlm): prefill about 420 tokens/s, a one-token
decode step 33 ms, a 21-token forward at a 20k context about 180 ms (so a
forward's fixed part, paid whatever its size, is some 130 ms there), a
recurrent state of about 143 MB, KV about 27 KB per token. What the account
does not give is assumed and named as such: the extra cost of each more
sequence in a decode batch, the bandwidth of a state snapshot. Every figure is
a flag of `lineage bench simulate`, so the policy's choices can be read at
other costs too. It knows arithmetic only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MachineCosts:
    prefill_tok_s: float = 420.0  # a long prefill's rate (the per-token part)
    chunk_fixed_ms: float = 130.0  # a forward's fixed part, whatever its size
    decode_ms: float = 33.0  # a one-sequence decode step
    decode_extra_ms: float = 3.0  # each more sequence of the batch (assumed)
    state_mb: float = 143.0  # the recurrent state: a snapshot's bytes
    kv_kb_per_token: float = 27.0
    copy_gb_s: float = 100.0  # a snapshot's copy rate (assumed: unified memory bandwidth)

    @property
    def token_ms(self) -> float:
        return 1000.0 / self.prefill_tok_s

    def chunk_ms(self, tokens: int) -> float:
        """One forward of `tokens` prompt tokens (all its sequences'); 0 tokens: nothing."""
        return self.chunk_fixed_ms + self.token_ms * tokens if tokens else 0.0

    def step_ms(self, sequences: int) -> float:
        """One decode step of `sequences` sequences; none: nothing."""
        if not sequences:
            return 0.0
        return self.decode_ms + self.decode_extra_ms * (sequences - 1)

    def snapshot_ms(self) -> float:
        """A state snapshot at a prompt end (what the next turn restores)."""
        return self.state_mb / 1000 / self.copy_gb_s * 1000

    def kv_mb(self, tokens: int) -> float:
        return tokens * self.kv_kb_per_token / 1000
