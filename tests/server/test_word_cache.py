"""The front end's tokenizer word cache stays small: novel long prompts through the
prompt builder (the real tokenizer and template) leave the resident set where it was,
and the cache is emptied on its interval."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from engine.server.prompts.word_cache import WORDS, WordCache, bpe_model
from tests.child import run_python

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "engine" / "runtime" / "model" / "assets" / "tokenizer"

# In a fresh process: the builder warmed by two novel prompts of 3,000 words (the first
# ones' buffers stay, as any long prompt's would), then four more; the resident set
# after each, malloc's free pages given back first.
CHILD = """
import ctypes, json, sys
import numpy as np
from mlx_lm.utils import load_tokenizer
from engine.server.prompts.prompt import PromptBuilder, PromptInput
libc = ctypes.CDLL(None)
libc.mallopt(-8, 1)  # one arena: the main thread's, as the prompt thread's would be
def resident():
    libc.malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
builder = PromptBuilder(load_tokenizer(sys.argv[1]), 1 << 20, 1 << 20)
out = []
for seed in range(6):
    rng = np.random.default_rng(seed)
    words = " ".join(f"w{int(x)}" for x in rng.integers(0, 10**6, 3000))
    builder.build(PromptInput(messages=({"role": "user", "content": f"Summarize: {words}"},)))
    out.append(resident())
print(json.dumps(out))
"""


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return False
    return Path("/proc/self/statm").exists()


@pytest.mark.skipif(not _glibc(), reason="measures the resident set with glibc's malloc_trim")
def test_novel_long_prompts_leave_the_front_ends_memory_where_it_was():
    _, resident = run_python(CHILD, str(ASSETS))
    # The last four bring 12,000 new words: +1.2 MiB in a cache of 10,000 words (the
    # 4,000 that fill it), +10-50 KiB in one of WORDS that the first prompt filled.
    grown = resident[-1] - resident[1]
    assert grown < 512 << 10, [r >> 10 for r in resident]


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(ASSETS)


def test_the_cache_is_found_behind_each_wrapper_and_emptied_on_its_interval(tokenizer):
    from tokenizers import Tokenizer

    backend = tokenizer._tokenizer.backend_tokenizer
    assert bpe_model(tokenizer) is not None
    assert bpe_model(tokenizer._tokenizer) is not None
    assert bpe_model(Tokenizer.from_file(str(ASSETS / "tokenizer.json"))) is not None
    now = [0.0]
    cache = WordCache(tokenizer, words=WORDS, seconds=60, clock=lambda: now[0])
    assert cache.bounded
    ids = backend.encode("def tick(self): return self.clock()").ids
    now[0] = 59.0
    cache.tick()
    assert cache.emptied == 0
    now[0] = 60.0
    cache.tick()
    cache.tick()
    assert cache.emptied == 1
    assert backend.encode("def tick(self): return self.clock()").ids == ids  # same tokens


def test_a_tokenizer_without_a_word_cache_is_left_as_it_is():
    class Plain:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    cache = WordCache(Plain(), clock=lambda: 1e9)
    assert not cache.bounded
    cache.tick()
    assert cache.emptied == 0
