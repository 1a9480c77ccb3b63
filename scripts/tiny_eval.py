"""What the embedded model has learned, measured on held-out text.

- held-out loss: mean next-token cross entropy (nats) and top-1 accuracy over
  consecutive windows of the held-out stream;
- MTP: the head's next-next-token loss and top-1 accuracy on the same windows;
- copy accuracy: a held-out snippet of whole lines in the user turn of a copy request,
  the reply decoded greedily; the fraction of the snippet's tokens reproduced at their
  own position (a token dropped or added early costs everything after it).

It knows the model, its MTP head and the corpus split; it knows nothing of training.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.runtime.speculative.mtp import MTPHead, lm_logits
from scripts import tiny_corpus

WINDOW = 256
WINDOWS = 48
# (snippets, lines each): short edits and a longer file.
COPY_SETS = ((16, 10), (4, 60))
PYTHON_PROMPT = "def parse_args(argv=None):\n"


def _cross_entropy(logits: mx.array, targets: mx.array) -> tuple[float, float]:
    """(sum of losses, count of top-1 hits) over every position."""
    loss = nn.losses.cross_entropy(logits, targets, reduction="sum")
    hits = (mx.argmax(logits, axis=-1) == targets).sum()
    return loss.item(), hits.item()


def heldout_metrics(model: nn.Module, head: MTPHead | None, windows: np.ndarray) -> dict:
    """Next-token (and, with a head, next-next-token) loss and top-1 over the windows."""
    sums = np.zeros(4)
    counts = np.zeros(2)
    for start in range(0, len(windows), 8):
        tokens = mx.array(windows[start : start + 8])
        hidden = model.model(tokens[:, :-1])
        sums[:2] += _cross_entropy(lm_logits(model, hidden), tokens[:, 1:])
        counts[0] += tokens[:, 1:].size
        if head is not None:
            h2 = head(hidden[:, :-1], tokens[:, 1:-1], model.model.embed_tokens)
            sums[2:] += _cross_entropy(lm_logits(model, h2), tokens[:, 2:])
            counts[1] += tokens[:, 2:].size
    out = {"heldout_loss": sums[0] / counts[0], "heldout_top1": sums[1] / counts[0]}
    if head is not None:
        out |= {"mtp_loss": sums[2] / counts[1], "mtp_top1": sums[3] / counts[1]}
    return {k: round(float(v), 4) for k, v in out.items()}


def greedy(model: nn.Module, prompt: list[int], count: int) -> list[int]:
    """`count` tokens decoded greedily after `prompt` (no stop token)."""
    cache = model.make_cache()
    logits = model(mx.array([prompt]), cache=cache)
    out = []
    for _ in range(count):
        token = mx.argmax(logits[0, -1])
        out.append(token.item())
        logits = model(token.reshape(1, 1), cache=cache)
    return out


def copy_accuracy(model: nn.Module, tokenizer, snippets: list[str]) -> float:
    """Mean fraction of each snippet's tokens the greedy reply reproduces in place."""
    scores = []
    for snippet in snippets:
        prompt = tiny_corpus.encode(tokenizer, tiny_corpus.copy_prompt(snippet))
        target = tiny_corpus.encode(tokenizer, snippet)
        reply = greedy(model, prompt, len(target))
        scores.append(float(np.mean(np.asarray(reply) == np.asarray(target))))
    return round(float(np.mean(scores)), 4)


def sample(model: nn.Module, tokenizer, text: str, count: int = 60) -> str:
    """The greedy continuation of `text` (raw text, no chat template), decoded."""
    return tokenizer.decode(greedy(model, tiny_corpus.encode(tokenizer, text), count))


def evaluate(model: nn.Module, head: MTPHead | None, corpus, tokenizer) -> dict:
    """Every figure docs/model.md reports."""
    windows = tiny_corpus.heldout_windows(corpus, WINDOW + 1, WINDOWS)
    out = heldout_metrics(model, head, windows)
    for count, lines in COPY_SETS:
        snippets = tiny_corpus.heldout_snippets(corpus, count, lines)
        out[f"copy_accuracy_{lines}_lines"] = copy_accuracy(model, tokenizer, snippets)
    out["sample"] = PYTHON_PROMPT + sample(model, tokenizer, PYTHON_PROMPT)
    return out
