"""The layout memo of the front end: fixed arrays, written when made, so conversations
nobody sent before leave its memory where it was; the least recently used start goes. A
long prompt's message starts are found without every token's offset in memory."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from engine.server.prompts import layout
from engine.server.prompts.prompt import PromptBuilder, PromptInput
from engine.server.prompts.renders import common_chars
from tests.child import run_python

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "engine" / "runtime" / "model" / "assets" / "tokenizer"


def key(n: int) -> bytes:
    return hashlib.blake2b(str(n).encode(), digest_size=16).digest()


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(ASSETS)


def conversation(seed: int, turns: int = 10) -> tuple[dict, ...]:
    messages = [{"role": "system", "content": f"You are agent {seed}."}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Session {seed}: fix bug {t} in f{t}()."})
        messages.append({"role": "assistant", "content": f"Fixed bug {t} of session {seed}."})
    return tuple(messages)


# In a process of its own (tracemalloc beside a session's Ray and MLX threads crashed a
# test process): 300 conversations nobody sent before through the prompt builder, each of
# 21 messages; what layout.py's lines hold after them, over what they held before.
CHILD = """
import json, sys, tracemalloc
from mlx_lm.utils import load_tokenizer
from engine.server.prompts import layout
from engine.server.prompts.prompt import PromptBuilder, PromptInput
from tests.server.test_layout_memo import conversation
builder = PromptBuilder(load_tokenizer(sys.argv[1]), 1 << 20, 1 << 20)
builder.build(PromptInput(messages=conversation(-1)))
mine = [tracemalloc.Filter(True, layout.__file__)]
tracemalloc.start()
before = tracemalloc.take_snapshot().filter_traces(mine)
for seed in range(300):
    builder.build(PromptInput(messages=conversation(seed)))
after = tracemalloc.take_snapshot().filter_traces(mine)
grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
memo = builder.layouts.memo
nbytes, slots = getattr(memo, "nbytes", 0), getattr(memo, "capacity", 0)
print(json.dumps({"grown": grown, "held": len(memo), "nbytes": nbytes, "slots": slots}))
"""


def test_novel_conversations_leave_the_memos_memory_where_it_was():
    _, out = run_python(CHILD, str(ASSETS))
    # 6,300 starts: an OrderedDict of them grew ~270 bytes each, 1.7 MiB here. The arrays
    # grow nothing; ~200 bytes a conversation stay, attributed to the line that calls
    # `_start` (60 KB here; not the memo's, and not yet explained).
    assert out["grown"] < 256 << 10, out
    assert out["held"] >= 6000 and out["nbytes"] == 40 * out["slots"], out


def test_a_conversation_that_goes_on_renders_only_its_new_prefixes(tokenizer):
    builder = PromptBuilder(tokenizer, 1 << 20, 1 << 20)
    first = builder.build(PromptInput(messages=conversation(7, turns=5)))
    renders = builder.layouts.renders
    longer = builder.build(PromptInput(messages=conversation(7, turns=6)))
    assert builder.layouts.renders - renders == 2  # the two new messages' starts
    assert longer.layout.starts[: len(first.layout.starts)] == first.layout.starts


class _Hashed:
    """layout's hashlib, counting the bytes it hashes."""

    def __init__(self):
        self.bytes = 0

    def blake2b(self, data: bytes, **kw):
        self.bytes += len(data)
        return hashlib.blake2b(data, **kw)


def _rendered(head, tools, role, text, date="Monday"):
    """A template's text before the message after `head` (a header with a date first)."""
    return f"[{date}]" + "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in head)


def test_a_long_conversation_hashes_its_text_once_over_and_a_changed_text_renders_again(
    monkeypatch,
):
    """A warm layout checks each remembered start on the text since the start before, so
    its hashing is linear in the prompt (it hashed every prefix: a 400-message prompt's
    text 200 times over); a text that differs before a remembered start renders again."""
    hashed = _Hashed()
    monkeypatch.setattr(layout, "hashlib", hashed)
    messages = conversation(3, turns=200)
    text = _rendered(messages, None, "", "")
    starts = [len(_rendered(messages[:k], None, "", "")) for k in range(len(messages))]
    layouts = layout.Layouts(_rendered)
    chars = range(len(text))  # a token a character
    cold = layouts.layout(messages, None, text, chars, chars)
    assert list(cold.starts) == starts and layouts.renders == len(messages)
    hashed.bytes = 0
    warm = layouts.layout(messages, None, text, chars, chars)
    assert warm == cold and layouts.renders == len(messages)
    # The digests, the key chain and the spans: a few times the text (every prefix: 200x).
    assert hashed.bytes < 6 * len(text.encode()), (hashed.bytes, len(text))
    # The same messages under another date: each start moves, found by rendering again.
    later = layout.Layouts(lambda *a: _rendered(*a, date="Tuesday!"))
    later.memo = layouts.memo
    moved = _rendered(messages, None, "", "", date="Tuesday!")
    shifted = [s + len("Tuesday!") - len("Monday") for s in starts]
    again = later.layout(messages, None, moved, range(len(moved)), range(len(moved)))
    assert list(again.starts) == shifted and later.renders == len(messages)


def _dated(messages, date):
    """A template's text: a date first, "(tools)" after it when a message is a tool's, and an
    assistant turn after the last user message shows its thinking (as Qwen3's and
    gpt-oss's keep only the latest turn's reasoning): what it writes before a message may
    differ from what the whole conversation's text has there."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    text = f"[{date}]" + ("(tools)" if any(m["role"] == "tool" for m in messages) else "")
    for i, m in enumerate(messages):
        thinking = "(thinking)" if m["role"] == "assistant" and i > max(users, default=-1) else ""
        text += f"<{m['role']}>{thinking}{m['content']}</{m['role']}>"
    return text


def _laid_out(layouts, messages, date):
    """The layout of `messages` rendered on `date` through `layouts` (its memo as it is), and
    the one a layout with no memo finds: where the template's text before each message stops
    matching the prompt's (renders.before's way)."""

    def before(head, tools, role, text):
        return text[: common_chars(_dated(head, date), text)]

    text = _dated(messages, date)
    chars = range(len(text))  # a token a character
    layouts.before = before
    return (
        layouts.layout(messages, None, text, chars, chars),
        layout.Layouts(before).layout(messages, None, text, chars, chars),
    )


def _said(*turns):
    return tuple({"role": role, "content": content} for role, content in turns)


def test_a_remembered_start_at_the_start_before_is_not_taken_for_another_prompts_text():
    """Where a later tool message puts "(tools)" in the header, the template's text before
    message 1 stops matching at the header's end: message 1 starts where message 0 does, and
    its remembered start has no text of its own between them. It was taken, unchecked, for
    a prompt of another day, whose message 1 starts after the system message."""
    layouts = layout.Layouts(None)
    remembered, fresh = _laid_out(
        layouts, _said(("system", "S"), ("user", "U"), ("tool", "T"), ("user", "V")), "Monday"
    )
    assert remembered == fresh and fresh.starts[1] == fresh.starts[0] == len("[Monday]")
    later = _said(("system", "S"), ("user", "U"), ("assistant", "A"))
    remembered, fresh = _laid_out(layouts, later, "Tuesday")
    assert fresh.starts[1] == len("[Tuesday]<system>S</system>")
    assert remembered == fresh, (remembered.starts, fresh.starts)


def test_a_remembered_start_is_not_taken_for_a_text_that_differs_before_the_start_before():
    """Message 3's remembered start (where the text stopped matching the template's, inside
    message 2, whose thinking the later user message hid) was taken for a prompt of another
    day whose text from message 2's start on read the same: the old whole-prefix check saw
    the date differ and rendered again; the text in that prompt shows message 2's thinking,
    and message 3 starts after it."""
    layouts = layout.Layouts(None)
    turns = (("system", "S"), ("user", "U"), ("assistant", "A"), ("assistant", "B"))
    remembered, fresh = _laid_out(layouts, _said(*turns, ("user", "V")), "Monday")
    assert remembered == fresh and fresh.starts[3] == fresh.starts[2] + len("<assistant>")
    remembered, fresh = _laid_out(layouts, _said(*turns), "Friday")  # a date of that length
    assert fresh.starts[3] == len("[Friday]<system>S</system><user>U</user>") + len(
        "<assistant>(thinking)A</assistant>"
    )
    assert remembered == fresh, (remembered.starts, fresh.starts)


def test_the_least_recently_used_key_of_its_slots_goes():
    memo = layout.Memo(entries=4, ways=4)  # one set of four slots: every key may take any
    for n in range(4):
        memo.put(key(n), n, 100 + n)
    assert memo.get(key(0)) == (0, 100)  # now the most recently used
    memo.put(key(4), 4, (1 << 64) - 1)
    assert memo.get(key(1)) is None  # the least recently used went
    assert memo.get(key(0)) == (0, 100) and memo.get(key(4)) == (4, (1 << 64) - 1)
    memo.put(key(4), 44, 7)  # a key put again takes its own slot
    assert memo.get(key(4)) == (44, 7) and len(memo) == 4 == memo.capacity


def long_novel(seed: int, words: int = 3000) -> PromptInput:
    """A conversation ending in `words` words nobody sent before (~18k tokens)."""
    rng = np.random.default_rng(seed)
    text = " ".join(f"w{int(x)}" for x in rng.integers(0, 10**6, words))
    return PromptInput(
        messages=(
            {"role": "system", "content": f"You are agent {seed}."},
            {"role": "user", "content": "Summarize naïvely ✓ 日本語 🎉 what follows."},
            {"role": "assistant", "content": "Send it."},
            {"role": "user", "content": f"Summarize: {text}"},
        )
    )


# In a process of its own: the Python memory one build of a long novel prompt takes at its
# peak, over what the process held before (the prompt's own tokens: ~600 KB of ints).
PEAK = """
import json, sys, tracemalloc
from mlx_lm.utils import load_tokenizer
from engine.server.prompts.prompt import PromptBuilder, PromptInput
from tests.server.test_layout_memo import long_novel
builder = PromptBuilder(load_tokenizer(sys.argv[1]), 1 << 20, 1 << 20)
builder.build(long_novel(99))
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
prompt = builder.build(long_novel(0))
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1] - base, "tokens": len(prompt.tokens)}))
"""


def test_a_long_prompts_layout_never_holds_every_tokens_offset():
    _, out = run_python(PEAK, str(ASSETS))
    # 18.7k tokens: 510 KiB at the peak; 2.6 MiB when every token's offset was a tuple (its
    # small objects freed a moment later, but what the front end kept meanwhile pinned them).
    assert out["tokens"] > 15000 and out["peak"] < 1 << 20, out


def test_message_starts_read_a_token_at_a_time_are_the_offsets_starts(tokenizer):
    builder = PromptBuilder(tokenizer, 1 << 20, 1 << 20)
    inp = long_novel(3, words=300)
    prompt = builder.build(inp)
    text = builder.render(list(inp.messages), None, True)
    encoding = tokenizer._tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    starts = layout.TokenStarts(encoding)
    offsets = [start for start, _ in encoding.offsets]
    assert list(starts) == offsets and len(starts) == len(prompt.tokens)
    # Every character (inside a multibyte one's tokens too) maps to the token it did.
    assert all(layout._token_at(starts, c) == layout._token_at(offsets, c) for c in range(0, 400))
    fresh = layout.Layouts(builder.layouts.before)
    assert prompt.layout == fresh.layout(inp.messages, None, text, offsets, prompt.tokens)
