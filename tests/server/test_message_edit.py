"""An edit or a truncation inside a long message, through the running server: real gRPC,
Ray and MLX, the session's random-weight engine (the default `message_interval`).

A first request carries a long message (a pasted file, a long tool result);
the next one changes it near its end. It must restore at a long-message point
of the first, at most one spacing (an eighth of the message) before the
change, not at the turn boundary before the message, and decode what a cold
prefill of the same prompt decodes.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from mlx_lm.utils import load_tokenizer

import engine.runtime.model.tiny_models as tm
from clients.bench.agents.agent_text import tool_result
from clients.client import Client
from clients.fanout import make_shared_prefix
from engine.cache.message_points import MESSAGE_SLICES, spacing
from engine.cache.tokens import common_prefix
from engine.config import CacheConfig
from engine.server.prompts.prompt import PromptBuilder, PromptInput

pytestmark = pytest.mark.ray

SYSTEM, TOOLS = make_shared_prefix(600, seed=5)
_ns = itertools.count()


@pytest.fixture(scope="module")
def client(random_engine):
    with Client(random_engine.address, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def builder():
    return PromptBuilder(load_tokenizer(tm.TOKENIZER_DIR), tm.VOCAB_SIZE, 1 << 20)


def pasted(rng: random.Random) -> str:
    return "Here is src/cache.py:\n" + tool_result(rng, "fs_read", 2600) + "\nWhat is wrong?"


def edit_near_the_end(text: str) -> str:
    """One line, nine tenths of the way in, rewritten (the user fixes the paste)."""
    lines = text.split("\n")
    k = int(len(lines) * 0.9)
    lines[k] = "    return None  # edited"
    return "\n".join(lines)


def paste_then_edit(rng):
    text = pasted(rng)
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    return first, first[:1] + [{"role": "user", "content": edit_near_the_end(text)}]


def tool_then_truncate(rng):
    output = tool_result(rng, "shell_run", 2600)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "shell_run", "arguments": '{"command": "pytest -q"}'},
    }
    head = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Run the tests and tell me what fails."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    first = head + [{"role": "tool", "tool_call_id": "call_1", "content": output}]
    cut = output[: int(len(output) * 0.85)] + "\n[output truncated]"
    later = head + [
        {"role": "tool", "tool_call_id": "call_1", "content": cut},
        {"role": "assistant", "content": "Some tests fail."},
        {"role": "user", "content": "Which ones?"},
    ]
    return first, later


@pytest.mark.parametrize("make", [paste_then_edit, tool_then_truncate], ids=["edit", "truncate"])
def test_a_change_near_the_end_of_a_long_message_restores_near_it(client, builder, make):
    first, changed = make(random.Random(7))
    ns = f"msgedit-{next(_ns)}"
    client.generate(messages=first, tools=TOOLS, max_tokens=4, namespace=ns)
    r2 = client.generate(messages=changed, tools=TOOLS, max_tokens=8, namespace=ns)
    cold = client.generate(messages=changed, tools=TOOLS, max_tokens=8, namespace=f"{ns}-cold")

    def build(messages):
        return builder.build(PromptInput(messages=tuple(messages), tools=tuple(TOOLS)))

    one, two = build(first), build(changed)
    change = common_prefix(np.asarray(one.tokens), np.asarray(two.tokens))  # where they part
    spans = one.layout.spans(len(one.tokens))
    (start, end), *_ = [s for s in spans if s[0] < change < s[1]]
    floor = CacheConfig().message_interval  # what the session's engine serves
    step = spacing(end - start, floor, MESSAGE_SLICES)
    assert change - start > 4 * step  # deep inside the long message
    assert r2.restore.kind == "message"
    assert change - step < r2.usage.cached_tokens == r2.restore.length <= change
    assert cold.restore.kind == "none" and r2.token_ids == cold.token_ids
