"""Which speculation a model replica runs, from its configuration (`--speculative`).

- `off`: none; the generation batch is mlx-lm's.
- `lookup`: prompt-lookup drafts (engine.runtime.drafts.PromptLookup).
- `draft`: a draft model's greedy drafts (engine.runtime.draft_model.DraftModel,
  from `--draft-model PATH`, loaded once per process).
- `auto`: every draft source the model supports (prompt lookup; with
  `--draft-model`, lookup where it matches a long n-gram, else the draft
  model: draft_model.LookupOrDraft, if the draft's decode step is cheap
  enough beside the model's to pay (draft_model.draft_pays, measured when the
  batch is built); the MTP head's drafts are not wired into the verify step
  yet), with each sequence's draft length adapted
  (engine.runtime.draft_length) unless `--num-draft-tokens` fixes it.
- `mtp`: refused by the configuration (ModelConfig): the MTP head does not feed
  the verify step yet.

It reads the config and builds; it keeps nothing.
"""

from __future__ import annotations

import logging

from engine.config import ModelConfig
from engine.runtime.draft_model import (
    PAYING_COST,
    DraftModel,
    LookupOrDraft,
    draft_pays,
    load_draft,
)
from engine.runtime.drafts import PromptLookup
from engine.runtime.speculative_batch import Speculation

log = logging.getLogger(__name__)


def speculation_for(config: ModelConfig, model=None) -> Speculation | None:
    """The batch's Speculation for `config` (serving `model`: auto measures whether a
    draft model pays beside it), or None for `--speculative off`."""
    mode = config.speculative
    if mode == "off":
        return None
    assert mode in ("lookup", "auto", "draft"), mode
    if mode == "lookup" or config.draft_model is None:
        return Speculation(PromptLookup(), config.num_draft_tokens)
    draft = DraftModel(load_draft(config.draft_model)[0])
    if mode == "draft":
        return Speculation(draft, config.num_draft_tokens)
    if model is not None and not _paying(draft.model, model):
        return Speculation(PromptLookup(), config.num_draft_tokens)
    return Speculation(LookupOrDraft(draft), config.num_draft_tokens)


def _paying(draft, model) -> bool:
    pays, cost = draft_pays(draft, model)
    if not pays:
        log.warning(
            "--speculative auto: the draft model's decode step costs %.2f of the model's "
            "(more than %.2f): auto drafts with prompt lookup alone",
            cost,
            PAYING_COST,
        )
    return pays
