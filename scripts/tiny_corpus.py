"""The embedded model's training and held-out text, and the sequences it trains on.

The corpus is the tokenizer's (`scripts/train_tokenizer.py`'s CORPUS_FILES: text that
ships with CPython). Each file's lines are split once: the first 95% train, the last
5% are held out (never trained on; the held-out loss and the copy test read them).

A training sequence is one of these kinds (a Mix gives their shares), drawn with a
seeded numpy Generator:
- text: a window of the training token stream (files joined by <|endoftext|>);
- repeat: a span of it written twice or more in a row, so the only way to predict the
  second copy is to look back (the attention layers learn induction);
- noise repeat: random token ids written twice or more, so nothing but looking back
  predicts them: over every ordinary id ("noise"), or over the K most frequent ids of
  the training text ("noise64", "noise512": over 64 the circuit that copies forms
  within a few hundred steps, and training starts there);
- chat copy: a ChatML conversation whose user turn holds a snippet of whole lines and
  whose assistant turn re-emits it, exactly or with a line or two changed, as an agent
  re-emits a file it has read.

It knows the tokenizer and the chat format; it knows nothing of MLX or the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from scripts.train_tokenizer import corpus_paths

TOKENIZER_JSON = (
    Path(__file__).resolve().parent.parent / "engine/runtime/model/assets/tokenizer/tokenizer.json"
)
ENDOFTEXT = "<|endoftext|>"
HELDOUT_FRACTION = 0.05

# The user turns of chat copies: what an agent asks when it wants a file back.
COPY_ASKS = (
    "Repeat this code exactly.",
    "Print the file again, unchanged.",
    "Here is the file:",
    "Apply the fix and show the whole file.",
    "Rewrite this with the change.",
    "Copy this snippet.",
    "Show me this again.",
    "Edit the code below and return it.",
)
SYSTEMS = ("You are a coding agent.", "You are a helpful assistant.", "Answer briefly.")
# The kinds of training sequence; a Mix gives each a share.
KINDS = ("text", "repeat", "noise", "noise64", "noise512", "chat")
Mix = tuple[tuple[str, float], ...]
# "noise" draws from every ordinary id: after the 3 ChatML specials, before the 4 markup
# tokens; "noise<K>" from the K most frequent ones in the training text.
NOISE_IDS = (3, 4092)


@dataclass(frozen=True)
class Corpus:
    """Lines per file (train and held-out parts) and the training token stream."""

    train_lines: tuple[tuple[str, ...], ...]
    heldout_lines: tuple[tuple[str, ...], ...]
    train_stream: np.ndarray  # int32 token ids of every train part, joined by ENDOFTEXT
    heldout_stream: np.ndarray
    frequent: np.ndarray  # the ordinary ids, most frequent in train_stream first


def load_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER_JSON))


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def load_corpus(tokenizer: Tokenizer) -> Corpus:
    """Read and split the corpus files. Raises FileNotFoundError naming a missing one."""
    train, heldout = [], []
    for path in corpus_paths():
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        cut = len(lines) - max(1, int(len(lines) * HELDOUT_FRACTION))
        train.append(tuple(lines[:cut]))
        heldout.append(tuple(lines[cut:]))
    eot = tokenizer.token_to_id(ENDOFTEXT)

    def stream(parts) -> np.ndarray:
        ids: list[int] = []
        for lines in parts:
            ids += encode(tokenizer, "".join(lines)) + [eot]
        return np.asarray(ids, dtype=np.int32)

    train_stream = stream(train)
    counts = np.bincount(train_stream, minlength=NOISE_IDS[1])[NOISE_IDS[0] : NOISE_IDS[1]]
    # Stable sort: ties keep id order, so the ranking is the same everywhere.
    frequent = (np.argsort(-counts, kind="stable") + NOISE_IDS[0]).astype(np.int32)
    return Corpus(tuple(train), tuple(heldout), train_stream, stream(heldout), frequent)


def chat_prompt(user: str, system: str | None = None) -> str:
    """A one-turn ChatML prompt as the embedded tokenizer's template renders it, the
    assistant's turn open."""
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def copy_prompt(snippet: str, ask: str = COPY_ASKS[0]) -> str:
    """The prompt of a copy request: the user turn holds the snippet."""
    return chat_prompt(f"{ask}\n\n{snippet}")


def pick_snippet(rng: np.random.Generator, files, lines: tuple[int, int]) -> str:
    """Whole consecutive lines (between lines[0] and lines[1]) of one file."""
    while True:
        text = files[int(rng.integers(len(files)))]
        count = int(rng.integers(lines[0], lines[1] + 1))
        if len(text) > count:
            start = int(rng.integers(len(text) - count))
            snippet = "".join(text[start : start + count])
            if snippet.strip():
                return snippet


def edit_lines(rng: np.random.Generator, snippet: str, files) -> str:
    """The snippet with one or two lines replaced, dropped or inserted."""
    lines = snippet.splitlines(keepends=True)
    for _ in range(int(rng.integers(1, 3))):
        at = int(rng.integers(len(lines)))
        kind = int(rng.integers(3))
        other = pick_snippet(rng, files, (1, 1))
        if kind == 0:
            lines[at] = other
        elif kind == 1 and len(lines) > 1:
            del lines[at]
        else:
            lines.insert(at, other)
    return "".join(lines)


def chat_copy_ids(
    rng: np.random.Generator, corpus: Corpus, tokenizer: Tokenizer, most_lines: int = 10
) -> list[int]:
    """One chat copy conversation's token ids: a snippet of 2 to `most_lines` lines."""
    files = corpus.train_lines
    snippet = pick_snippet(rng, files, (2, most_lines))
    reply = snippet if rng.random() < 0.5 else edit_lines(rng, snippet, files)
    if rng.random() < 0.5:  # half of them fenced, as chat replies often are
        snippet, reply = f"```python\n{snippet}```", f"```python\n{reply}```"
    ask = COPY_ASKS[int(rng.integers(len(COPY_ASKS)))]
    system = SYSTEMS[int(rng.integers(len(SYSTEMS)))] if rng.random() < 0.3 else None
    # Prompt and reply tokenized apart, as serving does: the prompt ends at the open
    # assistant turn and the reply's tokens are generated after it.
    prompt = chat_prompt(f"{ask}\n\n{snippet}", system)
    return encode(tokenizer, prompt) + encode(tokenizer, reply + "<|im_end|>\n")


def text_window(rng: np.random.Generator, stream: np.ndarray, n: int) -> np.ndarray:
    start = int(rng.integers(len(stream) - n))
    return stream[start : start + n]


def sequence(
    rng: np.random.Generator, corpus: Corpus, tokenizer: Tokenizer, n: int, mix: Mix
) -> np.ndarray:
    """One training sequence of exactly n token ids, of a kind drawn from `mix`."""
    kinds, shares = zip(*mix)
    kind = kinds[rng.choice(len(kinds), p=np.asarray(shares) / sum(shares))]
    if kind == "text":
        return text_window(rng, corpus.train_stream, n)
    if kind == "chat":
        ids: list[int] = []
        while len(ids) < n:
            ids += chat_copy_ids(rng, corpus, tokenizer, max(3, n // 25))
        return np.asarray(ids[:n], dtype=np.int32)
    size = int(rng.integers(n // 8, n // 2))
    if kind == "repeat":
        span = text_window(rng, corpus.train_stream, size)
    elif kind == "noise":
        span = rng.integers(*NOISE_IDS, size=size, dtype=np.int32)
    else:  # "noise<K>": the K most frequent ids of the training text
        span = corpus.frequent[rng.integers(0, int(kind[len("noise") :]), size=size)]
    return np.resize(span, n)  # the span over and over, cut at n


def batch(
    rng: np.random.Generator, corpus: Corpus, tokenizer: Tokenizer, size: int, n: int, mix: Mix
) -> np.ndarray:
    """[size, n] int32 token ids: `size` independent sequences."""
    return np.stack([sequence(rng, corpus, tokenizer, n, mix) for _ in range(size)])


def heldout_windows(corpus: Corpus, n: int, count: int) -> np.ndarray:
    """[count, n] consecutive windows of the held-out stream (fewer if it runs out)."""
    stream = corpus.heldout_stream
    count = min(count, len(stream) // n)
    return stream[: count * n].reshape(count, n)


def heldout_snippets(corpus: Corpus, count: int, lines: int, seed: int = 1) -> list[str]:
    """`count` held-out snippets of exactly `lines` lines each, fixed by `seed`."""
    rng = np.random.default_rng(seed)
    return [pick_snippet(rng, corpus.heldout_lines, (lines, lines)) for _ in range(count)]
