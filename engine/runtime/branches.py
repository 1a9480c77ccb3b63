"""`n` branches from one prefill: the sequences a request forks at its prompt end.

A request with `SamplingParams.n > 1` is prefilled once, as one sequence of
the batch (its branch 0). Each other branch is registered with the batch
generator at admission (`Branch`: its uid, sampler, matcher, stop tokens,
max_tokens); when the prompt batch moves branch 0 to decode, its rows are
gathered once per branch (`LineagePromptBatch.generate`): the attention KV
rows and the recurrent state are copied, as mlx-lm's batch filter does (the
batch merge copies anyway), and every branch samples its first token from
the same prompt end with its own sampler. A verbatim resend has no prompt
left: each branch samples its first token from the kept logits and enters
the batch with the same restored caches.

Each branch has its own seed (`branch_sampling`: the request's seed plus its
index), its own matcher when constrained, and its own events (`index`); only
branch 0 stores and commits the entry (the others' plans store nothing), and
the prompt is counted once in the usage (`branch_active`: a branch's record in the
batch beside its first's). Plain Python: no MLX.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.runtime.active import ActiveRequest
from engine.runtime.requests import GenerationRequest, SamplingParams


@dataclass(frozen=True)
class Branch:
    """A sequence forked from another at its prompt end, as the batch generator adds it."""

    uid: int
    sampler: object  # None: the batch's greedy sampler
    matcher: object  # its Matcher (engine.runtime.structured.matcher), or None
    stop: object  # mlx-lm StopSequences
    max_tokens: int


def branch_key(request_id: str, index: int) -> str:
    """A branch's key in the generator's books and for a stop ('#' is in no client's id)."""
    return request_id if index == 0 else f"{request_id}#{index}"


def branch_sampling(s: SamplingParams, index: int) -> SamplingParams:
    """Branch `index`'s sampling: one sequence, its own seed."""
    seed = None if s.seed is None else s.seed + index
    return dataclasses.replace(s, n=1, seed=seed)


def branch_request(req: GenerationRequest, index: int) -> GenerationRequest:
    """Branch `index`'s request: branch 0 keeps the plan (it stores the entry); the others
    store nothing and release nothing."""
    sampling = branch_sampling(req.sampling, index)
    if index == 0:
        return dataclasses.replace(req, sampling=sampling)
    plan = dataclasses.replace(req.plan, new_entry_id=None)
    return dataclasses.replace(req, sampling=sampling, plan=plan)


def branch_active(first: ActiveRequest, req: GenerationRequest, index: int, matcher):
    """Branch `index` of `req` in the batch, admitted with its first branch `first`: its
    own request, clock, matcher (None when unconstrained) and key; the restore's copies
    and the capture points are the first's."""
    return ActiveRequest(
        req=branch_request(req, index),
        emit=first.emit,
        uid=-1,
        restore_kind=first.restore_kind,
        restore_length=first.restore_length,
        captures=[],
        stop_ids=first.stop_ids,
        stamps=dataclasses.replace(first.stamps),
        restored_kv_bytes=first.restored_kv_bytes,
        restore_lost=first.restore_lost,
        matcher=matcher,
        index=index,
        key=branch_key(req.request_id, index),
    )
