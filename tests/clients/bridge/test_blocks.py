"""The completion's text as parts (clients.bridge.parsers) and as blocks
(clients.bridge.blocks): reasoning and tool calls never leak markup into text,
wherever the deltas split it, and a malformed call comes back as text."""

from __future__ import annotations

import pytest

from clients.bridge.blocks import REASONING, TEXT, TOOL_CALL, Blocks
from clients.bridge.parsers import ReasoningPart, TextPart, ToolCallEnd, make_parser

CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.py"}}\n</tool_call>'
CASES = [
    ("plain", "Hello there.", [(TEXT, "Hello there.")]),
    (
        "reasoning",
        "<think>\nLet me see.\n</think>\n\nIt is 4.",
        [(REASONING, "Let me see."), (TEXT, "It is 4.")],
    ),
    (
        "reasoning and a call",
        "<think>\nRead it first.\n</think>\n\nReading.\n" + CALL,
        # whitespace beside markup is layout: the text ends before the call's
        [(REASONING, "Read it first."), (TEXT, "Reading."), (TOOL_CALL, {"path": "setup.py"})],
    ),
    ("a call alone", CALL, [(TOOL_CALL, {"path": "setup.py"})]),
    (
        "two calls",
        CALL + "\n" + CALL.replace("setup.py", "README.md"),
        [(TOOL_CALL, {"path": "setup.py"}), (TOOL_CALL, {"path": "README.md"})],
    ),
    (
        "malformed call",
        "Try.\n<tool_call>\n{nope}\n</tool_call>",
        [(TEXT, "Try.\n<tool_call>\n{nope}\n</tool_call>")],
    ),
    ("cut off reasoning", "<think>\nStill thinking", [(REASONING, "Still thinking")]),
    ("near misses", "a <thin b </think c <tool d", [(TEXT, "a <thin b </think c <tool d")]),
    # the reasoning markup is the model's wherever it writes it (an atomic token here)
    ("think late", "Well <think>no</think>", [(TEXT, "Well"), (REASONING, "no")]),
]


def _blocks(text: str, cuts: list[int], parser=None) -> list[tuple[str, object]]:
    blocks = Blocks(parser or make_parser("qwen"))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    for piece in pieces:
        blocks.feed(piece, 1)
    blocks.close()
    return [(b.kind, b.arguments if b.kind == TOOL_CALL else b.text) for b in blocks.blocks]


@pytest.mark.parametrize("text,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_split_into_two_or_three_pieces_gives_the_same_blocks(text, want):
    assert _blocks(text, []) == want
    for i in range(1, len(text)):
        assert _blocks(text, [i]) == want, f"split at {i}: {text[:i]!r} | {text[i:]!r}"
    for i in range(1, len(text), 3):
        for j in range(i + 1, len(text), 5):
            assert _blocks(text, [i, j]) == want, (i, j)


def test_one_character_at_a_time_never_sends_markup():
    text = "<think>\nPlan.\n</think>\n\nDone.\n" + CALL
    parser = make_parser("qwen")
    parts = [p for ch in text for p in parser.feed(ch)] + parser.close()
    shown = "".join(p.text for p in parts if isinstance(p, (TextPart, ReasoningPart)))
    for tag in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<"):
        assert tag not in shown, tag


def test_a_malformed_call_ends_without_arguments_and_is_returned_as_text(caplog):
    parser = make_parser("qwen")
    parts = parser.feed("<tool_call>{bad json</tool_call>") + parser.close()
    assert [type(p) for p in parts] == [ToolCallEnd] and parts[0].arguments is None
    with caplog.at_level("WARNING"):
        got = _blocks("<tool_call>{bad json</tool_call>", [5])
    assert got == [(TEXT, "<tool_call>{bad json</tool_call>")]
    assert "malformed tool call" in caplog.text


def test_tool_choice_none_keeps_the_call_as_text():
    assert _blocks(CALL, [7], make_parser("qwen", tool_calls=False)) == [(TEXT, CALL)]


def test_reasoning_tokens_are_the_chunks_that_made_reasoning():
    blocks = Blocks(make_parser("qwen"))
    for piece in ["<think>", "\nOne", " two", "\n</think>", "\n\nAnswer", "."]:
        blocks.feed(piece, 1)
    blocks.close()
    assert blocks.reasoning_tokens == 3  # the opening tag's chunk, "One", " two"
