"""Which speculation a model replica runs, from its configuration (`--speculative`).

- `off`: none; the generation batch is mlx-lm's.
- `lookup`: prompt-lookup drafts (engine.runtime.drafts.PromptLookup).
- `draft`: a draft model's greedy drafts (engine.runtime.draft_model.DraftModel,
  from `--draft-model PATH`, loaded once per process).
- `auto`: every draft source the model supports (prompt lookup; with
  `--draft-model`, lookup where it matches a long n-gram, else the draft
  model: draft_model.LookupOrDraft; the MTP head's drafts are not wired into
  the verify step yet), with each sequence's draft length adapted
  (engine.runtime.draft_length) unless `--num-draft-tokens` fixes it.
- `mtp`: refused by the configuration (ModelConfig): the MTP head does not feed
  the verify step yet.

It reads the config and builds; it keeps nothing.
"""

from __future__ import annotations

from engine.config import ModelConfig
from engine.runtime.draft_model import DraftModel, LookupOrDraft, load_draft
from engine.runtime.drafts import PromptLookup
from engine.runtime.speculative_batch import Speculation


def speculation_for(config: ModelConfig) -> Speculation | None:
    """The batch's Speculation for `config`, or None for `--speculative off`."""
    mode = config.speculative
    if mode == "off":
        return None
    assert mode in ("lookup", "auto", "draft"), mode
    if mode == "lookup" or config.draft_model is None:
        return Speculation(PromptLookup(), config.num_draft_tokens)
    draft = DraftModel(load_draft(config.draft_model)[0])
    source = draft if mode == "draft" else LookupOrDraft(draft)
    return Speculation(source, config.num_draft_tokens)
