"""Speculation under a grammar: constrained rows draft, and decode exactly as masked plain
decoding does.

On the random-weight qwen3_next and the repo's tokenizer, with mlx-lm's
batches (the engine's generator) and the chunked schedule:
- greedy output under a JSON schema and a tool-call grammar is token for
  token the masked plain output, at batch 1 and in a batch that mixes
  constrained and unconstrained rows, for prompt-lookup drafts and for
  scripted drafts built from the plain reply with one token changed (to a
  token the grammar refuses, to the end token, or to another one), so drafts
  are cut by the grammar before the forward and accepted whole, in part or
  not at all after it;
- after every step each constrained row's matcher holds exactly the tokens
  its row emitted: the same next mask and the same accepting state as a fresh
  matcher fed those tokens;
- every finished output validates with jsonschema;
- at temperature 1 the first three tokens under a three-letter grammar are
  distributed as masked plain decoding's (chi-square, fixed seeds);
- the engine's model loop with `--speculative lookup` gives a plain loop's
  held replies: a schema, a tool call, a verbatim resend (its first token
  sampled at admission) and n = 2 branches, each with its own matcher.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.batching.batch import LineageBatchGenerator
from engine.runtime.batching.chunked import ChunkedBatchGenerator
from engine.runtime.batching.prefill_policy import PrefillScheduler
from engine.runtime.requests import SamplingParams
from engine.runtime.sampling import make_sampler
from engine.runtime.speculative.drafts import PromptLookup, ScriptedDrafts
from engine.runtime.speculative.speculative_batch import Speculation
from engine.runtime.structured.grammar import lark_grammar, schema_grammar, tool_grammar
from engine.runtime.structured.matcher import Grammars
from tests.runtime.conftest import start_loop
from tests.runtime.structured.test_matcher import SEARCH, WEATHER
from tests.runtime.test_branches import branches, submit

END = 2  # <|im_end|>: the batches' stop token and the grammars' end
MAX_TOKENS = 96
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "ok"],
}
CALL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}


@pytest.fixture(scope="module")
def parts(tiny_loaded):
    config, (model, tokenizer, info) = tiny_loaded
    return model, tokenizer, Grammars(tokenizer, info.vocab_size, {END})


def _grammars():
    return {
        "schema": schema_grammar(SCHEMA, strict=True),
        "tool": tool_grammar([WEATHER, SEARCH], "required", parallel=False, output_format="qwen"),
    }


def _generator(model, speculation, chunked: bool, max_tokens=MAX_TOKENS):
    if chunked:
        scheduler = PrefillScheduler("srpt", 16, 1, step_factor=2.5, slice_ms=50.0, overlap=True)
        return ChunkedBatchGenerator(
            model,
            scheduler=scheduler,
            max_tokens=max_tokens,
            stop_tokens=[[END]],
            prefill_step_size=16,
            speculation=speculation,
        )
    return LineageBatchGenerator(
        model, max_tokens=max_tokens, stop_tokens=[[END]], speculation=speculation
    )


def _run(gen, grammars, prompts, kinds, samplers=None, check=None):
    """Each prompt to its end, row i held to `kinds[i]`'s grammar (None: free); after every
    step `check(constraint, emitted, kind)` for each unfinished constrained row."""
    constraints = [grammars.matcher(_grammars()[k]) if k else None for k in kinds]
    uids = gen.insert_segments(
        [[p] for p in prompts],
        samplers=samplers,
        matchers=constraints,
    )
    out = {u: [] for u in uids}
    done: set = set()
    while len(done) < len(uids):
        for r in gen.next()[1]:
            out[r.uid].append(int(r.token))
            if r.finish_reason is not None:
                done.add(r.uid)
        if check is not None:
            for u, c, k in zip(uids, constraints, kinds):
                if c is not None and u not in done:
                    check(c, out[u], k)
    gen.close()
    return [out[u] for u in uids]


def _oracle(replies: list, prompts: list, kinds: list, grammars, refused: int):
    """Drafts: the plain reply's next tokens, with two positions in seven changed: to another token
    the grammar allows there (or one it refuses where it allows one alone), to a token it
    refuses, to the end token."""

    def other(kind, before, token):
        if kind is None:
            return token + 1
        fresh = grammars.matcher(_grammars()[kind])
        for t in before:
            fresh.accept(t)
        bits = fresh.mask()
        allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))
        return next((int(t) for t in allowed if t != token), refused)

    def changed(kind, reply, p):
        how = (p // 3) % 4
        return refused if how == 1 else END if how == 3 else other(kind, reply[:p], reply[p])

    def script(uid, context, k):
        for prompt, reply, kind in zip(prompts, replies, kinds):
            if list(context[: len(prompt)]) == prompt:
                done = len(context) - len(prompt)
                return [
                    changed(kind, reply, p) if p % 7 in (2, 5) else reply[p]
                    for p in range(done, min(done + k, len(reply)))
                ]
        return []

    return ScriptedDrafts(script)


def _prompts(tokenizer, n):
    texts = [
        'Reply with {"name": "ab", "n": 3, "ok": true} as JSON.',
        "Call get_weather for Oslo in c, or search for tides.",
        "def f(x):\n    return x + 1\n",
        "A few words of free text, then more words of free text.",
    ]
    return [tokenizer.encode(texts[i % len(texts)]) + [7 + i] for i in range(n)]


def _validates(tokenizer, ids, kind):
    assert ids[-1] == END, ids  # finished by the grammar's end, not max_tokens
    text = tokenizer.decode(ids[:-1])
    if kind == "schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        calls = [c.split("</tool_call>")[0].strip() for c in text.split("<tool_call>")[1:]]
        assert calls and text.startswith("<tool_call>"), text
        for call in map(json.loads, calls):
            jsonschema.validate(call["arguments"], CALL_SCHEMAS[call["name"]])


def _same_state(grammars):
    """A check: the matcher equals a fresh one fed the row's emitted tokens."""

    def check(constraint, emitted, kind):
        fresh = grammars.matcher(_grammars()[kind])
        for t in emitted:
            assert fresh.accept(t), (kind, emitted)
        assert constraint.consumed == fresh.consumed and constraint.done == fresh.done
        assert constraint.accepting() == fresh.accepting()
        held, expected = constraint.mask(), fresh.mask()
        assert (held is None) == (expected is None)
        assert held is None or np.array_equal(held, expected), (kind, emitted)

    return check


@pytest.mark.parametrize(
    "kinds,chunked",
    [(["schema"], False), (["tool"], False), (["schema", None, "tool", None], True)],
    ids=["schema-b1", "tool-b1", "mixed-b4-chunked"],
)
def test_greedy_speculation_under_a_grammar_is_masked_plain_decoding(parts, kinds, chunked):
    model, tokenizer, grammars = parts
    prompts = _prompts(tokenizer, len(kinds))
    check = _same_state(grammars)
    plain = _run(_generator(model, None, chunked), grammars, prompts, kinds, check=check)
    for ids, kind in zip(plain, kinds):
        if kind:
            _validates(tokenizer, ids, kind)
    refused = tokenizer.encode("}}")[0]
    outcomes: set = set()
    for k in (1, 3):
        gen = _generator(
            model, Speculation(_oracle(plain, prompts, kinds, grammars, refused), k), chunked
        )
        stats = gen._generation_batch.stats
        spoken = _run(gen, grammars, prompts, kinds, check=check)
        assert spoken == plain, (kinds, k)
        assert stats.grammar_cut > 0 and stats.verify_steps > 0 and stats.matcher_ms > 0
        outcomes.update(
            name
            for name in ("accepted_all", "accepted_some", "accepted_none")
            if getattr(stats, name)
        )
    # Drafts were accepted whole, in part (of more than one) and not at all.
    assert outcomes == {"accepted_all", "accepted_some", "accepted_none"}
    gen = _generator(model, Speculation(PromptLookup(), None), chunked)
    assert _run(gen, grammars, prompts, kinds, check=check) == plain


def test_a_reply_ended_inside_the_drafts_is_cut_as_plain_decoding_cuts_it(parts):
    """max_tokens falls inside accepted drafts, and the end token is drafted where the grammar
    is complete: the same tokens, the same finish."""
    model, tokenizer, grammars = parts
    prompts = _prompts(tokenizer, 2)
    kinds = ["schema", "schema"]
    for max_tokens in (5, 9, MAX_TOKENS):
        plain = _run(_generator(model, None, False, max_tokens), grammars, prompts, kinds)

        def script(uid, context, k, plain=plain):
            for prompt, reply in zip(prompts, plain):
                if list(context[: len(prompt)]) == prompt:
                    done = len(context) - len(prompt)
                    return reply[done : done + k] + [END] * k  # the reply, then the end
            return []

        gen = _generator(model, Speculation(ScriptedDrafts(script), 6), False, max_tokens)
        assert _run(gen, grammars, prompts, kinds) == plain
        assert gen._generation_batch.stats.accepted_all > 0


# ---------------------------------------------------------------- sampling ----

SEEDS = list(range(2000, 2000 + 480))
CRITICAL_26 = 54.05  # chi-square at p = 0.001, 26 degrees of freedom


def _first_letters(parts, speculation, seeds, outcomes=None):
    """The three letters of `start: /[qjk]{3}/` per seed, at temperature 1, 8 at a time;
    the speculating batches' draft outcomes counted into `outcomes`."""
    model, tokenizer, grammars = parts
    grammar = lark_grammar("start: /[qjk]{3}/")
    prompt = list(range(40, 70))
    out = []
    for start in range(0, len(seeds), 8):
        chunk = seeds[start : start + 8]
        samplers = [
            make_sampler(SamplingParams(max_tokens=4, temperature=1.0, seed=s), 4096) for s in chunk
        ]
        gen = _generator(model, speculation, False, max_tokens=4)
        constraints = [grammars.matcher(grammar) for _ in chunk]
        uids = gen.insert_segments([[prompt]] * len(chunk), samplers=samplers, matchers=constraints)
        got = {u: [] for u in uids}
        finished: set = set()
        while len(finished) < len(uids):
            for r in gen.next()[1]:
                got[r.uid].append(int(r.token))
                if r.finish_reason is not None:
                    finished.add(r.uid)
        stats = getattr(gen._generation_batch, "stats", None)
        for name in ("grammar_cut", "accepted_all", "accepted_some", "accepted_none"):
            if stats is not None:
                outcomes[name] = outcomes.get(name, 0) + getattr(stats, name)
        gen.close()
        for u in uids:
            assert got[u][3:] == [END], got[u]
            out.append(tokenizer.decode(got[u][:3]))
    return out


def test_sampling_under_a_grammar_keeps_masked_plain_decodings_distribution(parts):
    tokenizer = parts[1]
    plain = _first_letters(parts, None, SEEDS)
    assert all(len(w) == 3 and set(w) <= set("qjk") for w in plain)
    # Drafts: the plain run's most frequent continuation of each prefix (so they are often
    # accepted and often not), and a letter the grammar refuses after it.
    following: dict = {}
    for word in plain:
        for i in range(3):
            following.setdefault(word[:i], []).append(word[i])
    mode = {p: max(set(n), key=n.count) for p, n in following.items()}
    letters = {c: tokenizer.encode(c)[0] for c in "qjkx"}
    prompt_len = 30

    def script(uid, context, k):
        done = tokenizer.decode(list(context[prompt_len:]))
        drafts = []
        while len(drafts) < k and done in mode:
            drafts.append(letters[mode[done]])
            done += mode[done]
        return drafts + [letters["x"]]

    speculation = Speculation(ScriptedDrafts(script), 3)
    outcomes: dict = {}
    spec = _first_letters(parts, speculation, [s + 7 for s in SEEDS], outcomes)
    assert all(outcomes.values()) and len(outcomes) == 4, outcomes  # every draft outcome
    cells = sorted(set(plain) | set(spec))
    a = np.array([plain.count(c) for c in cells], dtype=float)
    b = np.array([spec.count(c) for c in cells], dtype=float)
    statistic = float(((a - b) ** 2 / (a + b)).sum())
    assert len(cells) <= 27 and all(set(w) <= set("qjk") for w in spec)
    assert statistic < CRITICAL_26, (statistic, dict(zip(cells, zip(a, b))))


# ---------------------------------------------------------------- the engine ----


@pytest.fixture(scope="module")
def spec_loop(tiny_loaded, tmp_path_factory):
    """tiny_loop's model loop, speculating: `--speculative lookup --num-draft-tokens 4`."""
    config, (model, tokenizer, info) = tiny_loaded
    config = EngineConfig(
        model=ModelConfig(
            path=config.model.path, prefill_step_size=128, speculative="lookup", num_draft_tokens=4
        ),
        cache=CacheConfig(cache_dir=str(tmp_path_factory.mktemp("spec")), ram_budget=1 << 30),
    )
    loop = start_loop(config, model, tokenizer, info)
    yield loop
    loop.stop()


def test_the_speculating_engine_holds_replies_as_the_plain_one(tiny_loop, spec_loop):
    schema, tool = _grammars()["schema"], _grammars()["tool"]
    # A prompt that holds the document: lookup drafts from it.
    doc = [int(t) for t in range(300, 340)] * 2
    resent = [(i * 13) % 3000 + 20 for i in range(40)]
    cases = [
        (doc, 1, schema),
        ([25, 36, 48] + doc[:20], 1, tool),
        ([30, 31, 32] * 6, 2, schema),  # two branches, a matcher each
        (resent, 1, None),  # stores the prompt's entry: the next one resends it
        (resent, 1, schema),
    ]
    replies = {}
    for name, loop in (("plain", tiny_loop), ("spec", spec_loop)):
        replies[name] = []
        for tokens, n, grammar in cases:
            ids, finals = branches(
                submit(loop, tokens, n, max_tokens=MAX_TOKENS, grammar=grammar)[1], n
            )
            replies[name].append((ids, [(f.finish_reason, f.incomplete) for f in finals]))
        if name == "spec":
            assert finals[0].cached_tokens == len(resent), "not a resend"
    assert replies["spec"] == replies["plain"]
    stats = spec_loop.ask(lambda g: g.bg._generation_batch.stats)
    assert stats.verify_steps > 0 and stats.matcher_ms > 0  # the held rows drafted
