"""Grammar-constrained decoding in the model tiny_loop, on the embedded random-weight model.

Without Ray: the ModelLoop the model actor wraps, with an in-process cache
manager. At temperature 1 the random weights write garbage, so an output that
validates is the constraint's doing: every output of a hypothesis-generated
schema (within the supported subset) must validate with `jsonschema`. At
temperature 0 a grammar that allows the model's own greedy choice changes
nothing. The grammar's checks (paths of refused keywords) and the Matcher
interface (mask, accept, rollback, validate) are tested on the real tokenizer.
"""

from __future__ import annotations

import json
import queue
import time

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cache.messages import PlanRequest
from engine.runtime.events import Finished, FinishReason, Tokens
from engine.runtime.requests import GenerationRequest, SamplingParams
from engine.runtime.structured.grammar import (
    GrammarError,
    lark_grammar,
    schema_grammar,
    tool_grammar,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 16}},
            "required": ["query"],
        },
    },
}


_ids = iter(range(1 << 30))


def run(tiny_loop, tokens, grammar=None, temperature=1.0, seed=0, max_tokens=300):
    """(generated ids, final event) of one request on the tiny_loop."""
    rid = f"c{next(_ids)}"
    # planned on the loop thread, as the actor's commits reach the manager there
    request = PlanRequest(rid, np.asarray(tokens, np.int32))
    plan = tiny_loop.ask(lambda g: tiny_loop.manager.plan(request))
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    req = GenerationRequest(rid, "", tuple(tokens), plan, sampling, time.time(), grammar=grammar)
    events: queue.SimpleQueue = queue.SimpleQueue()
    tiny_loop.call(lambda g: g.submit(req, events.put))
    ids = []
    while True:
        event = events.get(timeout=120)
        if isinstance(event, Tokens):
            ids += event.ids
        elif isinstance(event, Finished):
            return ids, event


# ---------------------------------------------------------------- schemas ----

_leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 100),
    ),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 10)),
    st.builds(
        lambda vals: {"enum": vals},
        st.lists(
            st.sampled_from(["red", "green", 3, None, True]), min_size=1, max_size=3, unique=True
        ),
    ),
    st.builds(lambda v: {"const": v}, st.sampled_from(["x", 1, False])),
)


def _object(children):
    props = st.dictionaries(st.sampled_from(["a", "b", "id", "name", "tags"]), children, max_size=3)
    return props.flatmap(
        lambda p: st.builds(
            lambda req: {"type": "object", "properties": p, "required": sorted(req)},
            st.sets(st.sampled_from(sorted(p) or ["a"])).map(lambda r: r & set(p)),
        )
    )


def _array(children):
    return st.builds(
        lambda items, n: {"type": "array", "items": items, "maxItems": n},
        children,
        st.integers(0, 3),
    )


def _any_of(children):
    return st.builds(lambda a, b: {"anyOf": [a, b]}, children, children)


SCHEMAS = st.recursive(_leaf, lambda c: st.one_of(_object(c), _array(c), _any_of(c)), max_leaves=6)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    schema=SCHEMAS.filter(lambda s: "type" not in s or s["type"] != "null"),
    seed=st.integers(0, 1 << 20),
)
def test_every_output_under_a_strict_schema_validates(tiny_loop, tiny_tokenizer, schema, seed):
    grammar = schema_grammar(schema, strict=True)
    ids, final = run(tiny_loop, [20 + seed % 50, 31, 47], grammar, temperature=1.0, seed=seed)
    assert final.finish_reason == FinishReason.STOP and not final.incomplete, (schema, ids)
    jsonschema.validate(json.loads(tiny_tokenizer.decode(ids)), schema)


def test_a_schema_cut_by_max_tokens_is_reported_incomplete(tiny_loop):
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    ids, final = run(tiny_loop, [22, 33, 44], schema_grammar(schema), max_tokens=3)
    assert final.finish_reason == FinishReason.LENGTH and final.incomplete and len(ids) == 3


def test_unconstrained_requests_report_complete(tiny_loop):
    _, final = run(tiny_loop, [22, 33, 44], None, max_tokens=3)
    assert final.finish_reason == FinishReason.LENGTH and not final.incomplete


@pytest.mark.parametrize("choice,name", [("required", ""), ("function", "search")])
def test_tool_choice_required_and_named_give_schema_valid_calls(
    tiny_loop, tiny_tokenizer, choice, name
):
    tools = [WEATHER, SEARCH]
    grammar = tool_grammar(tools, choice, name, output_format="qwen")
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for seed in range(4):
        ids, final = run(tiny_loop, [25, 36, 48 + seed], grammar, seed=seed)
        assert final.finish_reason == FinishReason.STOP and not final.incomplete, (
            tiny_tokenizer.decode(ids)
        )
        text = tiny_tokenizer.decode(ids)
        calls = [c.split("</tool_call>")[0].strip() for c in text.split("<tool_call>")[1:]]
        assert calls and text.startswith("<tool_call>"), text
        for call in map(json.loads, calls):
            assert not name or call["name"] == name
            jsonschema.validate(call["arguments"], by_name[call["name"]])


def test_a_single_call_when_parallel_calls_are_off(tiny_loop, tiny_tokenizer):
    grammar = tool_grammar([WEATHER, SEARCH], "required", parallel=False, output_format="qwen")
    for seed in range(3):
        ids, _ = run(tiny_loop, [26, 37, 49], grammar, seed=seed)
        assert tiny_tokenizer.decode(ids).count("<tool_call>") == 1


def test_a_grammar_allowing_the_greedy_choice_changes_nothing(tiny_loop, tiny_tokenizer):
    """Temperature 0: free text under `tool_choice: none` (which allows any valid text) gives
    the unconstrained tokens, for prompts whose greedy output is valid text."""
    grammar = tool_grammar([WEATHER], "none", output_format="qwen")
    compared = 0
    for first in range(20, 60):
        plain, _ = run(tiny_loop, [first, 30, 40], None, temperature=0.0, max_tokens=16)
        text = tiny_tokenizer.decode(plain)
        if "\ufffd" in text or any(t < 3 or t >= 4092 for t in plain):
            continue  # a partial UTF-8 byte or markup: text grammars refuse it
        held, _ = run(tiny_loop, [first, 30, 40], grammar, temperature=0.0, max_tokens=16)
        assert held == plain
        compared += 1
        if compared == 3:
            break
    assert compared == 3


def test_a_resend_samples_its_first_token_under_the_grammar(tiny_loop, tiny_tokenizer):
    """A verbatim resend restores the prompt end and samples its first token from the kept
    logits at admission: that token is held to the grammar too."""
    prompt = [(i * 11) % 3000 + 20 for i in range(40)]
    run(tiny_loop, prompt, None, temperature=0.0, max_tokens=2)  # stores the prompt's entry
    schema = {"type": "object", "properties": {"k": {"enum": ["v"]}}, "required": ["k"]}
    ids, final = run(tiny_loop, prompt, schema_grammar(schema, strict=True), temperature=0.0)
    assert final.cached_tokens == len(prompt), "not a resend"
    assert json.loads(tiny_tokenizer.decode(ids)) == {"k": "v"} and not final.incomplete


# ---------------------------------------------------------------- checks ----


@pytest.mark.parametrize(
    "schema,keyword,path",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems", "#/uniqueItems"),
        (
            {"type": "object", "properties": {"tags": {"type": "array", "contains": {}}}},
            "contains",
            "#/properties/tags/contains",
        ),
        ({"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}, "not", "#/anyOf/1/not"),
        ({"$ref": "https://example.com/s.json"}, "$ref", "#/$ref"),
        ({"type": "string", "format": "x-color"}, "x-color", "#/format"),
    ],
)
def test_an_unsupported_keyword_is_refused_with_its_path(schema, keyword, path):
    with pytest.raises(GrammarError) as e:
        schema_grammar(schema, where="json_schema")
    assert keyword in str(e.value) and path in str(e.value) and "json_schema" in str(e.value)


def test_strict_closes_objects():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    assert '"additionalProperties": false' in schema_grammar(schema, strict=True).lark
    assert "additionalProperties" not in schema_grammar(schema).lark


def test_tool_choice_errors_name_the_field():
    with pytest.raises(GrammarError, match="tool_choice names tool 'nope'"):
        tool_grammar([WEATHER], "function", "nope", output_format="qwen")
    with pytest.raises(GrammarError, match="has no tool-call grammar"):
        tool_grammar([WEATHER], "required", output_format="plain")
    with pytest.raises(GrammarError, match="tool_choice"):
        tool_grammar([WEATHER], "sometimes", output_format="qwen")
    assert tool_grammar([WEATHER], "auto", output_format="plain") is None


def test_a_malformed_lark_grammar_is_refused():
    with pytest.raises(GrammarError, match="grammar"):
        lark_grammar("start: (")


def test_the_constraint_interface(tiny_loaded):
    """mask / accept / rollback / validate / stopped / accepting, as speculative decoding
    will call them."""
    config, (model, tokenizer, info) = tiny_loaded
    from engine.runtime.structured.matcher import Grammars

    grammars = Grammars(tokenizer, info.vocab_size, {2})
    schema = {"type": "object", "properties": {"k": {"enum": ["v"]}}, "required": ["k"]}
    c = grammars.matcher(schema_grammar(schema, strict=True))
    doc = tokenizer.encode('{"k": "v"}')

    def allowed(t):
        return bool((int(c.mask().view(np.uint32)[t // 32]) >> (t % 32)) & 1)

    assert allowed(doc[0]) and not allowed(2)
    assert c.validate(doc + [2]) == len(doc) + 1
    assert c.validate(tokenizer.encode('{"k": "w"}')) < len(doc)
    for t in doc:
        assert c.accept(t)
    assert c.accepting() and allowed(2)
    c.rollback(2)
    assert not c.accepting()
    for t in doc[-2:]:
        assert c.accept(t)
    assert c.accept(2) and c.done and c.mask() is None and c.stopped()
    again = grammars.matcher(schema_grammar(schema, strict=True))
    assert grammars.compiled == 1 and grammars.hits == 1 and not again.accepting()
    assert not again.accept(2)  # the end before the grammar is complete: refused


def test_the_lazy_grammar_lets_text_run_and_holds_an_opened_call(tiny_loaded):
    """`tool_choice: auto`: free text is free until the `<tool_call>` token; from there the
    call is held to the tools' schemas; `parallel` false allows one call; `none` no call."""
    config, (model, tokenizer, info) = tiny_loaded
    from engine.runtime.structured.matcher import Grammars

    grammars = Grammars(tokenizer, info.vocab_size, {2})
    markup = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "%s"}}\n'
    call, bad = markup % "c" + "</tool_call>", markup % "k" + "</tool_call>"
    text = "Let me look that up.\n"

    def walk(grammar, doc) -> bool:
        c = grammars.matcher(grammar)
        return all(c.accept(t) for t in tokenizer.encode(doc)) and c.accept(2)

    auto = tool_grammar([WEATHER], "auto", output_format="qwen")
    single = tool_grammar([WEATHER], "auto", parallel=False, output_format="qwen")
    none = tool_grammar([WEATHER], "none", output_format="qwen")
    assert walk(auto, text) and walk(auto, text + call) and walk(auto, text + call + "\n" + call)
    assert not walk(auto, text + bad)
    assert walk(single, text + call) and not walk(single, text + call + "\n" + call)
    assert walk(none, text) and not walk(none, text + call)
    c = grammars.matcher(auto)
    for t in tokenizer.encode(text + "<tool_call>\n"):
        assert c.accept(t)
    opened = c.mask().view(np.uint32)
    allowed = [t for t in range(info.vocab_size) if (int(opened[t // 32]) >> (t % 32)) & 1]
    assert allowed and all(tokenizer.decode([t]).lstrip().startswith("{") for t in allowed)
