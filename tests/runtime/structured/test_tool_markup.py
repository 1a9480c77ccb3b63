"""Tool-call and reasoning markup matched as the tokenizer holds it.

On the embedded tokenizer `<tool_call>`, `</tool_call>`, `<think>` and `</think>`
are added tokens; on a copy where they are plain text (spelled in BPE pieces) the
same grammars must compile and hold the same outputs: free text runs until a call
opens, the call is held to its schema, `none` forbids calls, a `-thinking`
format's reasoning ends at its `</think>`. What does not compile for the served
tokenizer is the client's 400 when the client asked for it, and dropped
(counted) when it is the engine's own lazy `auto` grammar.
"""

from __future__ import annotations

import pytest

from engine.runtime.structured.grammar import json_object_grammar, lark_grammar, tool_grammar
from engine.runtime.structured.matcher import Grammars
from engine.server.errors import InvalidRequest
from engine.server.prompts.constraints import GrammarCheck
from engine.server.prompts.output_format import special_markers
from engine.server.prompts.renders import TemplateRenders
from tests.tokenizers import MARKUP, tokenizer_dir

VOCAB = 4096
STOP = 2  # <|im_end|>
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "%s"}}\n'
GOOD, BAD = CALL % "c" + "</tool_call>", CALL % "k" + "</tool_call>"
TEXT = "Let me look that up, <tool and all.\n"


def _load(path):
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(path)


@pytest.fixture(scope="module", params=["tokens", "text"])
def markup(request, tmp_path_factory):
    """(tokenizer, its special markers): the markup as added tokens, or as plain text."""
    drop = MARKUP if request.param == "text" else ()
    tokenizer = _load(tokenizer_dir(tmp_path_factory.mktemp(request.param), text_markup=drop))
    return tokenizer, special_markers(tokenizer)


def test_the_markers_are_read_from_the_vocabulary(markup):
    tokenizer, markers = markup
    single = {m for m in MARKUP if len(tokenizer.encode(m, add_special_tokens=False)) == 1}
    assert markers == single
    assert len(markers) in (0, 4)


def _walk(grammars, tokenizer, grammar, doc) -> bool:
    c = grammars.matcher(grammar)
    return all(c.accept(t) for t in tokenizer.encode(doc, add_special_tokens=False)) and c.accept(
        STOP
    )


def test_the_lazy_grammar_holds_calls_in_either_spelling(markup):
    tokenizer, markers = markup
    grammars = Grammars(tokenizer, VOCAB, {STOP})

    def grammar(choice, **kw):
        return tool_grammar([WEATHER], choice, output_format="qwen", markers=markers, **kw)

    auto, single, none = grammar("auto"), grammar("auto", parallel=False), grammar("none")
    required = grammar("required")
    walk = lambda g, doc: _walk(grammars, tokenizer, g, doc)  # noqa: E731
    assert walk(auto, TEXT) and walk(auto, TEXT + GOOD) and walk(auto, TEXT + GOOD + "\n" + GOOD)
    assert not walk(auto, TEXT + BAD)
    assert walk(single, TEXT + GOOD) and not walk(single, TEXT + GOOD + "\n" + GOOD)
    assert walk(none, TEXT) and not walk(none, TEXT + GOOD)
    assert walk(required, GOOD) and not walk(required, TEXT + GOOD)
    assert auto.optional and not required.optional and not none.optional


def test_reasoning_ends_at_its_marker_in_either_spelling(markup):
    tokenizer, markers = markup
    grammars = Grammars(tokenizer, VOCAB, {STOP})
    obj = json_object_grammar("qwen-thinking", markers)
    tools = tool_grammar([WEATHER], "auto", output_format="qwen-thinking", markers=markers)
    walk = lambda g, doc: _walk(grammars, tokenizer, g, doc)  # noqa: E731
    assert walk(obj, 'I think, <think at most.</think>\n{"a": 1}')
    assert not walk(obj, 'No end of reasoning {"a": 1}')
    assert walk(tools, "Hm.</think>" + TEXT + GOOD) and not walk(tools, "Hm.</think>" + BAD)


def test_a_grammar_that_does_not_compile_is_refused_or_dropped(markup):
    """A Lark text naming `<tool_call>` as a token compiles only where it is one: the
    client's grammar is a 400 naming why; the engine's own optional one is dropped and
    counted, never failed."""
    tokenizer, markers = markup
    renders = TemplateRenders(tokenizer)
    check = GrammarCheck(tokenizer, VOCAB, renders.failed)
    as_token = lark_grammar('start: "a" <tool_call> "b"\n')
    lazy = tool_grammar([WEATHER], "auto", output_format="qwen")  # markers as tokens
    if "<tool_call>" in markers:
        assert check.admit(as_token) is as_token and check.admit(lazy) is lazy
        assert renders.failures["grammar"] == 0
        return
    with pytest.raises(InvalidRequest, match="does not compile.*tool_call"):
        check.admit(as_token)
    assert check.admit(lazy) is None and renders.failures["grammar"] == 1
    assert check.admit(lazy) is None and renders.failures["grammar"] == 2  # memoized, counted
    own = tool_grammar([WEATHER], "auto", output_format="qwen", markers=markers)
    assert check.admit(own) is own
