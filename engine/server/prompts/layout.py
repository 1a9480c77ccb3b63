"""A chat prompt's layout: where each message starts in its tokens, and what each said.

The cache manager explains a miss with it (engine.cache.misses): the token where
a prompt left an earlier one falls in some message, and comparing that message
(and the tools) with the earlier prompt's says why. Message k starts where what
the chat template writes before it (engine.server.prompts.renders `before`: the render
of the messages before it, with the tools, or where the template refuses that,
the same followed by a placeholder message) stops matching the whole prompt's
text, mapped to the token holding that character (the tokenizer's offsets, read a
token at a time by bisection, never the whole list: `TokenStarts`);
so a template that renders the tools first has them before message 0. A
prefix that no render gives joins its message to the one before. Renders are
memoized by the digests of the messages they cover, so a
conversation that grows by a turn renders only its new prefixes (a 200-message
conversation of 32k tokens: 59 ms warm, 431 ms with every prefix rendered). The
memo (`Memo`) is arrays of a fixed size, its memory taken when it is made. A
message's digest is a short hash of the message as the template receives it.

It knows the template only through that function and the tokenizer only
through its offsets; nothing of the cache.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from array import array
from typing import Callable, Sequence

from engine.cache.messages import PromptLayout

# Message starts remembered, over every conversation: every start of ~80 conversations of
# 200 messages, in 40 bytes each (640 KiB), taken at start. (It was an OrderedDict of
# ~270 bytes an entry, 4.2 MiB that a soak's agent traffic filled over 30 minutes, and
# 65,536 entries before that, ~17 MiB; the front end's RSS rose all that time.)
MEMO_ENTRIES = 1 << 14
MEMO_WAYS = 8  # the slots a key may take; the least recently used of them goes


def digest(value) -> str:
    """16 hex digits of a JSON value's canonical text."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class TokenStarts:
    """Each token's first character in an encoding, read one token at a time: a sequence of
    `len(encoding)` ints that never builds the whole list. (`Encoding.offsets` builds a tuple
    per token: ~2 MiB of small objects for an 18k-token prompt, freed a moment later. The
    objects the front end keeps meanwhile land among them and pin their pages; a soak's front
    end stepped by 1.5-3.5 MiB at each novel 3,000-word prompt.) A layout reads ~15 of them a
    message, by bisection."""

    __slots__ = ("_encoding", "_n")

    def __init__(self, encoding):
        self._encoding, self._n = encoding, len(encoding)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._encoding.token_to_chars(i)[0]


def encode_with_offsets(tokenizer, text: str) -> tuple[tuple[int, ...], Sequence[int] | None]:
    """(token ids, each token's first character) of `text`; offsets None when the
    tokenizer has no fast backend to give them."""
    backend = getattr(getattr(tokenizer, "_tokenizer", tokenizer), "backend_tokenizer", None)
    if backend is None:
        return tuple(tokenizer.encode(text, add_special_tokens=False)), None
    encoding = backend.encode(text, add_special_tokens=False)
    return tuple(encoding.ids), TokenStarts(encoding)


def _token_at(starts: Sequence[int], char: int) -> int:
    """The first token whose text holds character `char` (or begins at it)."""
    i = bisect.bisect_left(starts, char)
    if i < len(starts) and starts[i] == char:
        return i
    if i == 0:
        return 0
    return bisect.bisect_left(starts, starts[i - 1])  # the first token of that character


def _chain(previous: bytes, item: str) -> bytes:
    return hashlib.blake2b(previous + item.encode(), digest_size=16).digest()


def _prefix_hash(previous: int, text: str, after: int, char: int) -> int:
    """A 64-bit hash of `text` up to `char`, chained: `previous` is this hash of the text up
    to the start before (`after`; 0 at the text's beginning), and `char` and the text from
    `after` to it are hashed onto it. Each start's text is hashed once, not every prefix
    over again, and two equal hashes are the same text up to `char` cut at the same starts.
    (A hash of the span alone took a remembered start for the text of a prompt that differed
    before the span, a header's date, and a start at or before the one before took none of
    the text.)"""
    span = previous.to_bytes(8, "little") + char.to_bytes(8, "little") + text[after:char].encode()
    return int.from_bytes(hashlib.blake2b(span, digest_size=8).digest(), "little")


class Memo:
    """16-byte keys -> (a character, a 64-bit hash), in `entries` slots of fixed arrays:
    a key may take one of `ways` slots, and replaces the least recently used of them. Its
    memory (40 bytes a slot) is written when it is made, so it never grows."""

    def __init__(self, entries: int = MEMO_ENTRIES, ways: int = MEMO_WAYS):
        self.ways = max(1, min(ways, entries))
        self.sets = max(1, entries // self.ways)
        zeros = bytes(8 * self.sets * self.ways)  # copied in: every page written now
        self.low, self.high = array("Q", zeros), array("Q", zeros)  # the key's halves
        self.chars, self.hashes = array("q", zeros), array("Q", zeros)
        self.used = array("q", zeros)  # when each slot was last used; 0: empty
        self.clock = 0

    @property
    def capacity(self) -> int:
        return self.sets * self.ways

    @property
    def nbytes(self) -> int:
        return sum(len(a) * a.itemsize for a in self._arrays())

    def _arrays(self):
        return (self.low, self.high, self.chars, self.hashes, self.used)

    def __len__(self) -> int:
        return self.capacity - self.used.count(0)

    def _find(self, key: bytes) -> tuple[int, int, int, int]:
        """(the key's first slot, its own slot or -1, the key's two halves)."""
        a, b = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
        base = (a % self.sets) * self.ways
        low, high, used = self.low, self.high, self.used
        for i in range(base, base + self.ways):
            if low[i] == a and high[i] == b and used[i]:
                return base, i, a, b
        return base, -1, a, b

    def get(self, key: bytes) -> tuple[int, int] | None:
        """(character, hash) of `key`, now the most recently used; None if absent."""
        _, i, _, _ = self._find(key)
        if i < 0:
            return None
        self.clock += 1
        self.used[i] = self.clock
        return self.chars[i], self.hashes[i]

    def put(self, key: bytes, char: int, text_hash: int) -> None:
        base, i, a, b = self._find(key)
        if i < 0:  # an empty slot, else the least recently used
            i = min(range(base, base + self.ways), key=self.used.__getitem__)
        self.clock += 1
        self.low[i], self.high[i] = a, b
        self.chars[i], self.hashes[i], self.used[i] = char, text_hash, self.clock


# (head messages, tools, the next message's role, the prompt's text) -> what the chat template
# writes before that message, a prefix of the text; None when the template renders nothing.
Before = Callable[[list, object, str, str], "str | None"]


class Layouts:
    """Builds PromptLayouts; one per front end (its prompt thread), memo included."""

    def __init__(self, before: Before, memo_entries: int = MEMO_ENTRIES):
        self.before = before
        self.memo = Memo(memo_entries)
        self.renders = 0  # prefix renders done (the memo's misses)

    def layout(
        self,
        messages: Sequence[dict],
        tools,
        text: str,
        token_starts: Sequence[int] | None,
        tokens: Sequence[int],
    ) -> PromptLayout:
        """The layout of a prompt whose rendered `text` tokenized to `tokens`, each
        starting at character `token_starts[i]` (None: no offsets, no starts)."""
        digests = tuple(digest(m) for m in messages)
        roles = tuple(str(m.get("role", "")) for m in messages)
        tools_digest = digest(list(tools)) if tools else ""
        if token_starts is None or not messages:
            return PromptLayout((), digests, roles, tools_digest)
        key = _chain(b"", tools_digest)
        # Message 0 starts after what the template renders before it (a header, a default
        # system prompt and, where the template puts them first, the tools).
        # The memo's key: the tools, the messages before, and the next message's role (what
        # the template writes before a message may depend on its role).
        first, prefix = self._start(_chain(key, roles[0]), [], tools, roles[0], text, 0, 0)
        first = first or 0
        starts = [_token_at(token_starts, first) if tokens and first else 0]
        after = first  # the last message start known in the text; `prefix`: the text's to it
        for k in range(1, len(messages)):
            key = _chain(key, digests[k - 1])
            char, prefix = self._start(
                _chain(key, roles[k]), messages[:k], tools, roles[k], text, after, prefix
            )
            # A prefix the template refuses to render joins its message to the one before.
            at = _token_at(token_starts, char) if tokens and char is not None else 0
            starts.append(max(starts[-1], at))
            after = after if char is None else char
        return PromptLayout(tuple(starts), digests, roles, tools_digest)

    def _start(
        self, key: bytes, head: Sequence[dict], tools, role: str, text: str, after: int, prefix: int
    ) -> tuple[int | None, int]:
        """(The character of `text` where the messages after `head` begin (None: unknown),
        the `_prefix_hash` of the text up to it). `after`: the start found for the message
        before (0 for the first), `prefix` the hash of the text up to it (0 for the first).
        A remembered start is taken when the text up to it, cut at the same starts before,
        is what it was when it was remembered (the check of the whole prefix it was), its
        hash chained from the start before: the prompt's text is hashed once over, not once
        a message (quadratic in its length: most of a 500-message layout's time)."""
        hit = self.memo.get(key)
        if hit is not None and hit[0] <= len(text):
            chained = _prefix_hash(prefix, text, after, hit[0])
            if chained == hit[1]:
                return hit[0], chained
        self.renders += 1
        shown = self.before(list(head), tools, role, text)
        if shown is None:
            return None, prefix
        char = len(shown)
        chained = _prefix_hash(prefix, text, after, char)
        self.memo.put(key, char, chained)
        return char, chained
