"""Which speculation a model replica runs, from its configuration (`--speculative`).

- `off`: none; the generation batch is mlx-lm's.
- `lookup`: prompt-lookup drafts (engine.runtime.drafts.PromptLookup).
- `auto`: every draft source the model supports (prompt lookup, today: the
  MTP head's drafts are not wired into the verify step yet), with each
  sequence's draft length adapted (engine.runtime.draft_length) unless
  `--num-draft-tokens` fixes it.
- `mtp`, `draft`: refused by the configuration (ModelConfig): the MTP head and
  the draft model do not feed the verify step yet.

It reads the config and builds; it keeps nothing.
"""

from __future__ import annotations

from engine.config import ModelConfig
from engine.runtime.drafts import PromptLookup
from engine.runtime.speculative_batch import Speculation


def speculation_for(config: ModelConfig) -> Speculation | None:
    """The batch's Speculation for `config`, or None for `--speculative off`."""
    mode = config.speculative
    if mode == "off":
        return None
    assert mode in ("lookup", "auto"), mode
    return Speculation(PromptLookup(), config.num_draft_tokens)
