"""The batch generator each prefill schedule runs (`--schedule`, ModelConfig.schedule).

`batched` is mlx-lm's padded prefill batch with the warm path's copies taken
out (LineageBatchGenerator, the baseline); `srpt` and `fifo` run the prefill
scheduler's chunks beside decode (ChunkedBatchGenerator over a
PrefillScheduler). It reads the model config and builds; it keeps nothing.
"""

from __future__ import annotations

from mlx_lm.generate import BatchGenerator

from engine.config import EngineConfig
from engine.runtime.batching.batch import LineageBatchGenerator
from engine.runtime.batching.chunked import ChunkedBatchGenerator
from engine.runtime.batching.prefill_log import PrefillLog
from engine.runtime.batching.prefill_policy import PrefillScheduler
from engine.runtime.batching.prefill_worker import module_eval_default
from engine.runtime.batching.step_profile import StepProfile
from engine.runtime.speculative.speculation import speculation_for


def new_batch_generator(
    model, config: EngineConfig, profile: StepProfile, log: PrefillLog | None = None
) -> BatchGenerator:
    """A fresh batch generator for `model` as the config's schedule asks."""
    m = config.model
    common = dict(
        completion_batch_size=m.max_batch,
        prefill_batch_size=m.max_batch,
        prefill_step_size=m.prefill_step_size,
        clear_pool_per_prefill=config.cache.clear_pool_per_prefill,
        speculation=speculation_for(config, model),
    )
    if m.schedule == "batched":  # mlx-lm's padded prefill batch: the baseline
        return LineageBatchGenerator(model, **common)
    scheduler = PrefillScheduler(
        m.schedule,
        m.prefill_budget,
        m.prefill_group,
        step_factor=m.prefill_step_factor,
        slice_ms=m.prefill_slice_ms,
        overlap=m.prefill_overlap,
        wait_bound=m.prefill_wait_bound,
        chunk_max=m.prefill_chunk_max,
        fixed_share=1 / m.prefill_growth,
    )
    module_eval = {"module": True, "forward": False}.get(m.prefill_eval)
    return ChunkedBatchGenerator(
        model,
        scheduler=scheduler,
        profile=profile,
        log=log,
        module_eval=module_eval_default() if module_eval is None else module_eval,
        **common,
    )
