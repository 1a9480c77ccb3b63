"""The prompt builder's message spans (PlanRequest.message_spans) on the real tokenizer.

Each span is held to the reference method, the one the anchor uses: the chat
template rendered on the messages before a message and tokenized, its common
prefix with the prompt's tokens. A span must start at or after that message's
start, end at or before the next one's, and hold exactly the text the
message put in the prompt.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from mlx_lm.utils import load_tokenizer

import engine.runtime.tiny_models as tm
from clients.bench.agent_text import make_tools, tool_call, tool_result
from engine.server.message_spans import pieces
from engine.server.prompt import PromptBuilder, PromptInput

INTERVAL = 256  # the cache's message_interval the builder locates messages for


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(tm.TOKENIZER_DIR)


def builder(tokenizer, interval: int = INTERVAL) -> PromptBuilder:
    return PromptBuilder(tokenizer, tm.VOCAB_SIZE, 1 << 20, message_min_tokens=interval)


def conversation(seed: int = 0) -> tuple[list, list]:
    """A system prompt, tools, and turns with tool results short and long, a pasted file,
    non-ASCII text and an assistant writing a file through a tool call."""
    rng = random.Random(seed)
    tools = make_tools(600, seed)
    code = tool_result(rng, "fs_read", 700)
    messages = [
        {"role": "system", "content": "You are a careful coding agent. " * 20},
        {"role": "user", "content": f"Here is the file:\n```\n{code}\n```\nWhat does it do?"},
        {"role": "assistant", "content": "It sums sizes. Let me look at the tests."},
    ]
    for k, size in enumerate([30, 900, 60, 1500, 140]):
        call = tool_call(rng, f"t{k}", tools)
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": tool_result(rng, "shell_run", size),
            },
        ]
    messages += [
        {"role": "user", "content": "Übersetze die Fehlermeldung: «größer als erwartet» " * 40},
        {
            "role": "assistant",
            "content": "Writing the fix.",
            "tool_calls": [
                {
                    "id": "w1",
                    "type": "function",
                    "function": {
                        "name": "fs_write",
                        "arguments": json.dumps({"path": "src/fix.py", "body": code}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "w1", "content": "ok"},
        {"role": "user", "content": messages[1]["content"]},  # the same file, pasted again
        {"role": "user", "content": "Thanks, now run the tests."},
    ]
    return messages, tools


def reference_starts(b: PromptBuilder, messages, tools, prompt) -> list[int]:
    """Each message's first token and the prompt's end, by rendering prefixes (the anchor's way)."""
    ids = np.asarray(prompt)
    out = []
    for i in range(len(messages)):
        head = np.asarray(b.tokenizer.encode(b.render(messages[:i], tools, False)))
        n = min(len(head), len(ids))
        differ = np.nonzero(head[:n] != ids[:n])[0]
        out.append(int(differ[0]) if differ.size else n)
    return out + [len(prompt)]


def test_spans_hold_each_long_message_exactly_where_the_template_put_it(tokenizer):
    b = builder(tokenizer)
    messages, tools = conversation()
    prompt = b.build(PromptInput(messages=tuple(messages), tools=tuple(tools)))
    plain = builder(tokenizer, 0).build(PromptInput(messages=tuple(messages), tools=tuple(tools)))
    assert prompt.tokens == plain.tokens and prompt.anchor_len == plain.anchor_len
    assert plain.message_spans == ()
    starts = reference_starts(b, messages, tools, prompt.tokens)
    located = []
    for a, e in prompt.message_spans:
        i = max(k for k in range(len(messages)) if starts[k] <= a)  # the message it lies in
        assert e <= starts[i + 1], (i, a, e, starts[i + 1])
        located.append(i)
        # its tokens are the message's own text, from its first piece to its last (less a
        # token merged with the template's text before it: `: {"` holds the "{" of arguments)
        text = tokenizer.decode(list(prompt.tokens[a:e]))
        first, last = pieces(messages[i])[0], pieces(messages[i])[-1]
        assert any(text.startswith(first[k : k + 64]) for k in range(3)), (i, text[:80])
        assert text.endswith(last[-64:]), (i, text[-80:])
    # every message longer than the interval, and no short one (the system block is the anchor's)
    lengths = [starts[i + 1] - starts[i] for i in range(len(messages))]
    assert located == [i for i in range(1, len(messages)) if lengths[i] > INTERVAL + 8]
    assert min(lengths[i] for i in located) < 1.5 * INTERVAL  # the bound is tight enough
    assert all(lengths[i] < INTERVAL for i in range(1, len(messages)) if i not in located)


def test_a_template_that_rewrites_content_falls_back_to_rendering_prefixes():
    tokenizer = load_tokenizer(tm.TOKENIZER_DIR)  # a copy of its own: its template changes
    verbatim = "{{- text(message.content) -}}{%- if message.role == 'assistant' and"
    assert verbatim in tokenizer.chat_template
    tokenizer.chat_template = tokenizer.chat_template.replace(
        verbatim,
        "{{- text(message.content) | replace('a', 'A') -}}{%- if message.role == 'assistant' and",
    )
    b = builder(tokenizer)
    messages, tools = conversation(1)
    messages = [m for m in messages if not m.get("tool_calls")]  # content alone: never found
    prompt = b.build(PromptInput(messages=tuple(messages), tools=tuple(tools)))
    starts = reference_starts(b, messages, tools, prompt.tokens)
    long = [i for i in range(1, len(messages)) if starts[i + 1] - starts[i] > INTERVAL + 8]
    assert len(long) > 2
    # the latest two, from one message's start to the next one's (at most 2 per prompt)
    assert prompt.message_spans == tuple((starts[i], starts[i + 1]) for i in long[-2:])


@pytest.mark.parametrize(
    "inp",
    [
        PromptInput(prompt_ids=tuple(range(10, 2000))),
        PromptInput(prompt_text="plain text " * 400),
        PromptInput(messages=({"role": "user", "content": "short"},)),
    ],
    ids=["ids", "text", "short"],
)
def test_no_spans_without_long_messages(tokenizer, inp):
    assert builder(tokenizer).build(inp).message_spans == ()
