"""Which speculation a model replica runs, from its configuration (`--speculative`).

- `off`: none; the generation batch is mlx-lm's.
- `lookup`: prompt-lookup drafts (engine.runtime.drafts.PromptLookup).
- `mtp`: the model's MTP head (engine.runtime.mtp, engine.runtime.mtp_drafts),
  `--num-draft-tokens` chained drafts per step (1 unless set); a model without
  `mtp.*` weights is refused, naming the flag.
- `auto`: prompt lookup with each sequence's draft length adapted
  (engine.runtime.draft_length) unless `--num-draft-tokens` fixes it. It does
  not take the MTP head: measured on this CPU, a head step costs more than its
  accepted drafts save (docs/benchmarks.md, "Speculative decoding").
- `draft`: refused by the configuration (ModelConfig) until the draft model
  feeds the verify step.

It reads the config and the model directory and builds; it keeps nothing.
"""

from __future__ import annotations

from engine.config import EngineConfig
from engine.runtime.drafts import PromptLookup
from engine.runtime.mtp import load_mtp
from engine.runtime.speculative_batch import Speculation


def speculation_for(config: EngineConfig, model) -> Speculation | None:
    """The batch's Speculation for `config` serving `model`, or None for `--speculative off`."""
    m = config.model
    if m.speculative == "off":
        return None
    if m.speculative == "mtp":
        from engine.runtime.loader import resolve_model_path

        path = resolve_model_path(config)
        head = load_mtp(path, model)
        if head is None:
            raise ValueError(
                f"--speculative mtp: {path} has no MTP head (no mtp.* weights in its "
                "safetensors files)"
            )
        chain = m.num_draft_tokens or 1
        return Speculation(None, chain, mtp=head, mtp_chain=chain)
    assert m.speculative in ("lookup", "auto"), m.speculative
    return Speculation(PromptLookup(), m.num_draft_tokens)
