"""The front end's completion text (engine.server.front.text) on the committed byte-level BPE
tokenizer, through mlx-lm's own TokenizerWrapper: the text streamed id by id is the
tokenizer's whole decode (a reply's leading space and indentation kept), and a stop
string ends it at its start, whichever step it completes in."""

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from engine.runtime.model.tiny_models import TOKENIZER_DIR
from engine.server.front.text import TextStream

REPLIES = [
    "        return self.path\n",  # a method body: eight spaces of indentation
    " Paris, then Lyon.",  # an OpenAI completion keeps its first space
    "\n    x = 1\n",
    "plain text",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER_DIR)


@pytest.mark.parametrize("reply", REPLIES)
@pytest.mark.parametrize("per_step", [1, 3])
def test_streamed_text_is_the_whole_decode(tokenizer, reply, per_step):
    ids = tokenizer.encode(reply, add_special_tokens=False)
    assert tokenizer.decode(ids) == reply  # the tokenizer round-trips it
    text = TextStream(tokenizer.detokenizer)
    pieces = [text.feed(ids[i : i + per_step]) for i in range(0, len(ids), per_step)]
    assert "".join(pieces) + text.close() == reply


def test_a_stop_string_ends_the_text_at_its_start(tokenizer):
    reply = "    value = 1\n    return value\n"
    ids = tokenizer.encode(reply, add_special_tokens=False)
    text = TextStream(tokenizer.detokenizer, ("return",))
    shown = "".join(text.feed([i]) for i in ids) + text.close()
    assert shown == "    value = 1\n    " and text.stopped
    assert text.count < len(ids)


def test_the_stop_string_that_ended_the_text_is_named(tokenizer):
    ids = tokenizer.encode("    value = 1\n    return value\n", add_special_tokens=False)
    text = TextStream(tokenizer.detokenizer, ("never", "return", "= 1"))
    "".join(text.feed([i]) for i in ids)
    assert text.stopped and text.stop_sequence == "= 1"  # the first the text completes
    unstopped = TextStream(tokenizer.detokenizer, ("never",))
    unstopped.feed(ids)
    assert unstopped.stop_sequence == "" and not unstopped.stopped
