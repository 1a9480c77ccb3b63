"""Which speculation a model replica runs, from its configuration (`--speculative`).

- `off`: none; the generation batch is mlx-lm's.
- `lookup`: prompt-lookup drafts (engine.runtime.drafts.PromptLookup).
- `mtp`: the model's MTP head (engine.runtime.mtp, engine.runtime.mtp_drafts),
  `--num-draft-tokens` chained drafts per step (1 unless set); a model without
  `mtp.*` weights is refused, naming the flag.
- `auto`: prompt lookup with each sequence's draft length adapted
  (engine.runtime.draft_length) unless `--num-draft-tokens` fixes it, and the
  MTP head beside it where the model has one and its step pays here
  (engine.runtime.mtp_costs, timed at load): a row's lookup guess first, else
  the head's. On the embedded model on a CPU it does not pay.
- `draft`: refused by the configuration (ModelConfig) until the draft model
  feeds the verify step.

It reads the config and the model directory and builds; it keeps nothing.
"""

from __future__ import annotations

import logging

from engine.config import EngineConfig
from engine.runtime import mtp_costs
from engine.runtime.drafts import PromptLookup
from engine.runtime.mtp import load_mtp
from engine.runtime.speculative_batch import Speculation

log = logging.getLogger(__name__)


def speculation_for(config: EngineConfig, model) -> Speculation | None:
    """The batch's Speculation for `config` serving `model`, or None for `--speculative off`."""
    m = config.model
    if m.speculative == "off":
        return None
    if m.speculative == "mtp":
        head = _head(config, model)
        if head is None:
            raise ValueError(
                f"--speculative mtp: {_model_dir(config)} has no MTP head (no mtp.* or "
                "model.layers.N.* weights in its safetensors files)"
            )
        chain = m.num_draft_tokens or 1
        return Speculation(None, chain, mtp=head, mtp_chain=chain)
    assert m.speculative in ("lookup", "auto"), m.speculative
    if m.speculative == "auto":
        head = _head(config, model)
        if head is not None:
            costs = mtp_costs.measure(model, head)
            log.info("speculative auto: MTP head %s (%s)", "on" if costs.pays() else "off", costs)
            if costs.pays():
                return Speculation(PromptLookup(), m.num_draft_tokens, mtp=head)
    return Speculation(PromptLookup(), m.num_draft_tokens)


def _model_dir(config: EngineConfig):
    from engine.runtime.loader import resolve_model_path

    return resolve_model_path(config)


def _head(config: EngineConfig, model):
    return load_mtp(_model_dir(config), model)
