"""Which speculation a model replica runs, from its configuration (`--speculative`).

- `off`: none; the generation batch is mlx-lm's.
- `lookup`: prompt-lookup drafts (engine.runtime.speculative.drafts.PromptLookup).
- `mtp`: the model's MTP head (engine.runtime.speculative.mtp and .mtp_drafts),
  `--num-draft-tokens` chained drafts per step (1 unless set); a model without
  one is refused, naming the flag. Under `auto` the head chains as many
  (`Speculation.mtp_chain`): K when the flag fixes K, 1 when it is auto.
- `draft`: a draft model's greedy drafts (engine.runtime.speculative.draft_model.DraftModel,
  from `--draft-model PATH`, loaded once per process).
- `auto`: every draft source the model supports and that pays here, with each
  sequence's draft length adapted (engine.runtime.speculative.draft_length) unless
  `--num-draft-tokens` fixes it: prompt lookup; with `--draft-model`, lookup
  where it matches a long n-gram, else the draft model
  (draft_model.LookupOrDraft), if the draft's decode step is cheap enough
  beside the model's (draft_model.draft_pays, measured when the batch is
  built); the MTP head where the model has one and a step with its draft pays
  (engine.runtime.speculative.mtp_costs, timed at load), a row's other guess first, else
  the head's. On the embedded model on a CPU neither the shipped draft nor the
  head pays: auto is prompt lookup there.

It reads the config and the model directory and builds; it keeps nothing.
"""

from __future__ import annotations

import logging

from engine.config import EngineConfig
from engine.runtime.model.draft_files import load_draft
from engine.runtime.model.loader import resolve_model_path
from engine.runtime.speculative import mtp_costs
from engine.runtime.speculative.draft_model import (
    PAYING_COST,
    DraftModel,
    LookupOrDraft,
    draft_pays,
)
from engine.runtime.speculative.drafts import PromptLookup
from engine.runtime.speculative.mtp import load_mtp
from engine.runtime.speculative.speculative_batch import Speculation

log = logging.getLogger(__name__)


def speculation_for(config: EngineConfig, model) -> Speculation | None:
    """The batch's Speculation for `config` serving `model` (auto measures whether a draft
    model and an MTP head pay beside it), or None for `--speculative off`."""
    m = config.model
    mode = m.speculative
    if mode == "off":
        return None
    if mode == "mtp":
        head = _head(config, model)
        if head is None:
            raise ValueError(
                f"--speculative mtp: {_model_dir(config)} has no MTP head (no mtp.* or "
                "model.layers.N.* weights in its safetensors files)"
            )
        return Speculation(None, m.num_draft_tokens or 1, mtp=head)
    assert mode in ("lookup", "auto", "draft"), mode
    if mode == "lookup":
        return Speculation(PromptLookup(), m.num_draft_tokens)
    draft = DraftModel(load_draft(m.draft_model)[0]) if m.draft_model else None
    if mode == "draft":
        return Speculation(draft, m.num_draft_tokens)
    source = PromptLookup()
    if draft is not None and _paying(draft.model, model):
        source = LookupOrDraft(draft)
    head = _head(config, model)
    if head is not None:
        costs = mtp_costs.measure(model, head)
        log.info("speculative auto: MTP head %s (%s)", "on" if costs.pays() else "off", costs)
        if costs.pays():
            return Speculation(source, m.num_draft_tokens, mtp=head)
    return Speculation(source, m.num_draft_tokens)


def _paying(draft, model) -> bool:
    pays, cost = draft_pays(draft, model)
    if not pays:
        log.warning(
            "--speculative auto: the draft model's decode step costs %.2f of the model's "
            "(more than %.2f): auto drafts without it",
            cost,
            PAYING_COST,
        )
    return pays


def _model_dir(config: EngineConfig):
    return resolve_model_path(config)


def _head(config: EngineConfig, model):
    return load_mtp(_model_dir(config), model)
