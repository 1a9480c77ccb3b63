"""`n` branches from one prefill, in the model tiny_loop on the embedded model (no Ray).

At temperature 0 the n branches are n copies of the one-branch answer; at
temperature 1 each branch has its own seed; the prompt is prefilled once (the
prefill timing and the batch's token count say so); under a constraint each
branch holds its own matcher; a verbatim resend forks from the kept logits;
cancelling the request ends every branch.
"""

from __future__ import annotations

import json
import queue
import time

import numpy as np

from engine.cache.messages import PlanRequest
from engine.runtime.events import Finished, FinishReason, Tokens
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.runtime.structured.grammar import schema_grammar

_ids = iter(range(1 << 30))


def submit(tiny_loop, tokens, n, temperature=0.0, seed=None, max_tokens=12, grammar=None):
    rid = f"n{next(_ids)}"
    # planned on the loop thread, as the actor's commits reach the manager there
    request = PlanRequest(rid, np.asarray(tokens, np.int32))
    plan = tiny_loop.ask(lambda g: tiny_loop.manager.plan(request))
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, n=n)
    req = GenerationRequest(rid, "", tuple(tokens), plan, sampling, time.time(), grammar=grammar)
    events: queue.SimpleQueue = queue.SimpleQueue()
    tiny_loop.call(lambda g: g.submit(req, events.put))
    return rid, events


def branches(events, n) -> tuple[list[list[int]], list[Finished]]:
    ids: list[list[int]] = [[] for _ in range(n)]
    finals: list = [None] * n
    while any(f is None for f in finals):
        event = events.get(timeout=120)
        if isinstance(event, Tokens):
            ids[event.index] += event.ids
        elif isinstance(event, Finished):
            assert finals[event.index] is None, "two finals for one branch"
            finals[event.index] = event
    return ids, finals


def test_four_greedy_branches_equal_one(tiny_loop):
    prompt = [(i * 17) % 3000 + 20 for i in range(60)]
    one, (single,) = branches(submit(tiny_loop, prompt, 1)[1], 1)
    four, finals = branches(submit(tiny_loop, prompt + [7], 4)[1], 4)
    again, _ = branches(submit(tiny_loop, prompt + [7], 1)[1], 1)
    assert four == again * 4 and len(four[0]) == 12
    assert all(f.finish_reason == FinishReason.LENGTH for f in finals)
    assert [f.index for f in finals] == [0, 1, 2, 3] and one[0]


def test_seeded_branches_differ_and_each_is_its_own_seed(tiny_loop):
    prompt = [(i * 19) % 3000 + 20 for i in range(40)]
    four, _ = branches(submit(tiny_loop, prompt, 4, temperature=1.0, seed=100)[1], 4)
    assert len({tuple(b) for b in four}) > 1
    for index in (0, 2):  # branch i samples as a one-branch request seeded seed + i
        alone, _ = branches(
            submit(tiny_loop, prompt + [1], 1, temperature=1.0, seed=100 + index)[1], 1
        )
        forked, _ = branches(submit(tiny_loop, prompt + [1], 4, temperature=1.0, seed=100)[1], 4)
        assert forked[index] == alone[0]


def test_each_branch_holds_its_own_grammar(tiny_loop, tiny_tokenizer):
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b", "c"]}}, "required": ["k"]}
    grammar = schema_grammar(schema, strict=True)
    ids, finals = branches(
        submit(tiny_loop, [30, 31, 32], 3, temperature=1.0, seed=4, max_tokens=60, grammar=grammar)[
            1
        ],
        3,
    )
    for branch, final in zip(ids, finals):
        assert final.finish_reason == FinishReason.STOP and not final.incomplete
        assert json.loads(tiny_tokenizer.decode(branch))["k"] in "abc"


def test_a_resend_forks_from_the_kept_logits(tiny_loop):
    prompt = [(i * 23) % 3000 + 20 for i in range(50)]
    branches(submit(tiny_loop, prompt, 1, max_tokens=2)[1], 1)  # stores the prompt's entry
    ids, finals = branches(submit(tiny_loop, prompt, 3)[1], 3)
    assert all(f.cached_tokens == len(prompt) for f in finals)
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 12


def test_cancelling_ends_every_branch(tiny_loop):
    rid, events = submit(tiny_loop, [(i * 29) % 3000 + 20 for i in range(30)], 3, max_tokens=500)
    while not isinstance(events.get(timeout=60), Tokens):
        pass
    tiny_loop.call(lambda g: g.cancel(rid))
    _, finals = branches(events, 3)
    assert {f.finish_reason for f in finals} == {FinishReason.CANCELLED}
    assert tiny_loop.ask(lambda g: len(g.active)) == 0


def test_the_fork_copy_is_charged_to_the_request(tiny_loop, tiny_loaded):
    """The gather that forks n branches copies n rows of the prompt's KV (and state): the
    copy ledger charges it to the request (branch 0's figures), like every other reshuffle."""
    _, (_, _, info) = tiny_loaded
    prompt = [(i * 23) % 3000 + 20 for i in range(80)]
    _, finals = branches(submit(tiny_loop, prompt, 3, max_tokens=4)[1], 3)
    forked = 3 * info.kv_bytes_per_token * len(prompt)
    assert finals[0].timing.bytes_copied_batch >= forked, finals[0].timing
