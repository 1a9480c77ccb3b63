"""Where a prompt's long messages lie among its tokens: the spans of PlanRequest.message_spans.

The cache policy places long-message points inside each span, every
`--message-interval` tokens from its start (engine.cache.message_points), so
only messages that can be longer than that interval are located. A token
covers at least one byte of text (byte-level BPE; SentencePiece with byte
fallback), so a message whose JSON form plus `TEMPLATE_BYTES` is shorter than
the interval in bytes cannot be; the others are the candidates.

A candidate's span is the text it puts in the prompt verbatim (its content or
text parts, its reasoning, its tool calls' argument strings, each of at least
`MIN_PIECE` characters: its *pieces*), from the first piece's first character
to the last piece's last one, found in the rendered prompt in message order
(each search starts where the previous message's pieces ended, so a message
is never found inside an earlier one), and mapped to tokens through the
tokenizer's own offsets of that one tokenization: the span starts at the
first token that starts at or after its first character and ends before the
first token that starts at or after its end. That is exact for the text the
template copies. A candidate with pieces none of which the template copied
(a template that rewrites content) is located as the anchor is: the template
rendered on the messages before it and on those up to it, each compared with
the prompt's text; at most `FALLBACK_MESSAGES` of them, the latest, per
prompt, since each costs two renders of a prefix. A candidate without pieces
(only short texts) is left out. Spans no longer than the interval hold no
point and are dropped.

A span only guides where checkpoints go: every length of the prompt is a
valid checkpoint, so a span found wrong (or not found) costs a restore
point's placement, never a wrong restore.

It knows the chat messages, the rendered text and a tokenizer's offsets; it
knows nothing of the cache.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

TEMPLATE_BYTES = 256  # what a template may add to a message beyond its JSON form
FALLBACK_MESSAGES = 2  # candidates located by rendering prefixes, per prompt
MIN_PIECE = 32  # characters: a shorter text could be found in the wrong place


def candidates(messages: Sequence[dict], first: int, min_tokens: int) -> list[int]:
    """Indexes of the messages from `first` on that may hold more than `min_tokens` tokens."""
    if min_tokens <= 0:
        return []
    out = []
    for i in range(first, len(messages)):
        size = len(json.dumps(messages[i], ensure_ascii=False, default=str).encode())
        if size + TEMPLATE_BYTES > min_tokens:
            out.append(i)
    return out


def pieces(message: dict) -> list[str]:
    """The texts a chat template copies verbatim from `message`, in the order it renders them."""
    out = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        out.append(reasoning)
    content = message.get("content")
    if isinstance(content, str):
        out.append(content)
    elif isinstance(content, list):
        out += [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    for call in message.get("tool_calls") or ():
        fn = call.get("function", call) if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            out.append(fn["arguments"])
    return [p for p in out if len(p) >= MIN_PIECE]


def char_spans(
    text: str,
    messages: Sequence[dict],
    indexes: Sequence[int],
    start: int,
    render: Callable[[list], str],
) -> list[tuple[int, int]]:
    """Character spans of the messages `indexes` (ascending) in `text`, the prompt rendered,
    searched from character `start` on (the end of the system block); `render(messages)`
    renders a prefix of the conversation without the generation prompt."""
    found: dict[int, tuple[int, int]] = {}
    missing = []
    cursor = start
    for i in indexes:
        texts = pieces(messages[i])
        span = _find(text, texts, cursor) if texts else None
        if span is not None:
            found[i] = span
            cursor = span[1]
        elif texts:
            missing.append(i)
    for i in missing[-FALLBACK_MESSAGES:]:  # rendered as the anchor is: exact, and costly
        begin = common_prefix(render(list(messages[:i])), text)
        end = common_prefix(render(list(messages[: i + 1])), text)
        if begin < end:
            found[i] = (begin, end)
    spans = [found[i] for i in sorted(found)]
    return [s for k, s in enumerate(spans) if k == 0 or s[0] >= spans[k - 1][1]]


def token_spans(
    spans: Sequence[tuple[int, int]], first_token_from: Callable[[int], int], longer: int = 0
) -> tuple:
    """Character spans as token spans of more than `longer` tokens (a shorter one holds no
    point); `first_token_from(char)`: the first token that starts at or after `char`."""
    out = []
    for begin, end in spans:
        a, b = first_token_from(begin), first_token_from(end)
        if b - a > longer:
            out.append((a, b))
    return tuple(out)


def _find(text: str, texts: list[str], cursor: int) -> tuple[int, int] | None:
    """The span from the first to the last of `texts` found in order from `cursor`."""
    begin = end = None
    for piece in texts:
        at = text.find(piece, end if end is not None else cursor)
        if at < 0:
            continue
        begin = at if begin is None else begin
        end = at + len(piece)
    return None if begin is None else (begin, end)


def common_prefix(a: str, b: str) -> int:
    """Characters `a` and `b` share from the start."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
