"""What each policy of `lineage bench agents` served, as observed, and the oracle it is held to.

`Observed` is one request as a policy served it; `PolicyRun` a policy's whole
run (its requests, its cache figures after each step); `oracle_lengths` the
most a cache could have held for each request. The benchmark (clients.bench.agents)
writes these records and its report (clients.bench.agents.report) reads them. Plain
Python and numpy: nothing here knows an engine or a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.cache.tokens import common_prefix

POLICIES = ("lineage", "exact", "off", "mlx_lm", "mlx_lm_server")
PEER_SERVERS = ("mlx_lm_server", "mlx_vlm")  # servers in subprocesses (clients.bench.peers)


@dataclass
class Observed:
    """One request as a policy served it."""

    rid: int
    step: int
    lane: int
    kind: str
    prompt: np.ndarray  # prompt token ids
    completion: list  # ids received (all of them, or up to the drop)
    completed: bool
    cached: int = 0
    restore: str = "none"
    restore_length: int = 0
    ttft_ms: float = 0.0

    @property
    def stored(self) -> np.ndarray:
        """What a later request may share: prompt + completion once the reply completed."""
        if not self.completed:
            return self.prompt
        return np.concatenate([self.prompt, np.asarray(self.completion, dtype=self.prompt.dtype)])


@dataclass
class PolicyRun:
    name: str
    observed: list = field(default_factory=list)
    stats: list = field(default_factory=list)  # cache figures after each step
    evictions: int = 0
    wall_s: float = 0.0
    replicas: dict = field(default_factory=dict)  # several replicas: clients.bench.agents.replicas


def oracle_lengths(steps, prompts, stored) -> list[int]:
    """Per request, the longest prefix shared with `stored` of any request of an earlier step.

    `stored[j]` is request j's prompt, plus its completion if it completed.
    Capped at the prompt length minus 1 (one token must be computed).
    """
    out = []
    for i, prompt in enumerate(prompts):
        best = max(
            (common_prefix(prompt, stored[j]) for j in range(len(prompts)) if steps[j] < steps[i]),
            default=0,
        )
        out.append(max(0, min(best, len(prompt) - 1)))
    return out
