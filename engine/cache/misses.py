"""Why a prompt missed: the earlier prompts of each namespace, and a Miss that says where and why.

The manager records every committed request's tokens (the prompt, plus the reply
where the cache stored it) with its layout (engine.cache.messages.PromptLayout:
where each message starts, a digest of each message and of the tools). A new
prompt is compared with the earlier one it shares the longest prefix with (the
most recent among equals):

- It continues that prompt (shares all of it, or is all but its last token
  within it): a miss only when the cache restored less and holds no entry
  sharing that much: EVICTED, at the token it could have restored to.
- It leaves that prompt at token t, in message k of its own: the kind comes
  from comparing the two prompts' messages. In the system block (a system
  message, or before the first message): SYSTEM when that system message
  changed, else TOOLS when the tools changed, else TEMPLATE. After it: HISTORY
  when message k changed (or the earlier prompt had no such message but the
  cache's reply there), TEMPLATE when message k is the same as sent and
  rendered to other tokens (a reply sent back otherwise than it was generated
  counts here too). Leaving it in the first message after the system block is a
  new conversation beside it (sub-agents sharing a system prompt), not a miss.
  A prompt of raw tokens has no messages: only EVICTED is said of it.

Bounded: at most `per_namespace` records a namespace and `max_tokens` tokens in
all, the least recently recorded going first; a record that a newer one extends
(its lineage's next turn) is replaced by it. Plain Python plus numpy, like the
rest of engine.cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.cache.kinds import MissKind
from engine.cache.messages import Miss, PromptLayout
from engine.cache.tokens import common_prefix

PER_NAMESPACE = 64  # records kept per namespace
MAX_TOKENS = 8 << 20  # tokens kept over every namespace (32 MiB of int32)


@dataclass(frozen=True)
class Record:
    """One committed request: what the cache stored of it, and its prompt's layout."""

    tokens: np.ndarray  # int32: the prompt, then the reply where the cache stored it
    layout: PromptLayout


def explain(
    prompt: np.ndarray,
    layout: PromptLayout,
    restored: int,
    earlier: Record,
    stored: Callable[[], int],
) -> Miss | None:
    """The Miss of `prompt` (restored at `restored`) against `earlier`, the record sharing
    its longest prefix; `stored()` gives the longest prefix any stored entry shares
    with it (asked only when the prompt continues the earlier one)."""
    shared = common_prefix(earlier.tokens, prompt)
    if shared >= len(earlier.tokens) or shared >= len(prompt) - 1:
        want = min(shared, len(prompt) - 1)  # a prompt always prefills its last token
        if restored >= want or stored() >= want:
            return None
        message = layout.message_at(want) if layout.starts else -1
        return Miss(MissKind.EVICTED, want, message, len(earlier.tokens))
    if not (layout.starts and earlier.layout.starts):
        return None  # raw tokens: no messages to say why
    k = layout.message_at(shared)
    kind = _kind(layout, earlier.layout, k)
    if kind is None:
        return None
    return Miss(kind, shared, k, len(earlier.tokens))


def _kind(now: PromptLayout, before: PromptLayout, k: int) -> MissKind | None:
    """Why the prompt left the earlier one inside message k (-1: before the first)."""
    head = now.head
    if k < head:  # the system block: its messages, the tools, the template's header
        if k >= 0 and _differs(now, before, k):
            return MissKind.SYSTEM
        if now.tools != before.tools:
            return MissKind.TOOLS
        if now.digests[:head] != before.digests[: before.head]:
            return MissKind.SYSTEM
        return MissKind.TEMPLATE
    if k == head:
        return None  # the first message after the system block: another conversation
    if k < len(before.digests):
        return MissKind.HISTORY if _differs(now, before, k) else MissKind.TEMPLATE
    # Past the earlier prompt's messages: in the reply the cache stored after it.
    return MissKind.TEMPLATE if now.roles[k] == "assistant" else MissKind.HISTORY


def _differs(now: PromptLayout, before: PromptLayout, k: int) -> bool:
    if k >= len(before.digests):
        return True
    return (now.digests[k], now.roles[k]) != (before.digests[k], before.roles[k])


def shared_prefix(tiers, namespace: str, prompt: np.ndarray, has_state_layers: bool) -> int:
    """The longest prefix any stored entry of `namespace` shares with `prompt`, over the
    tiers' indexes (each with `lookup`: engine.cache.index.Index, the DiskIndex)."""
    return max(t.lookup(namespace, prompt, has_state_layers).sibling_lcp for t in tiers)


class MissLog:
    """The earlier prompts of each namespace, bounded; `explain` for a new one."""

    def __init__(self, per_namespace: int = PER_NAMESPACE, max_tokens: int = MAX_TOKENS):
        self.per_namespace = per_namespace
        self.max_tokens = max_tokens
        self.records: OrderedDict[tuple[str, int], Record] = OrderedDict()  # oldest first
        self.by_namespace: dict[str, dict[int, Record]] = {}
        self.tokens = 0
        self._ids = 0

    def record(self, namespace: str, tokens: np.ndarray, layout: PromptLayout) -> None:
        """Keep a committed request's tokens; the records it extends go."""
        for rid, r in list(self.by_namespace.get(namespace, {}).items()):
            n = len(r.tokens)
            if n <= len(tokens) and np.array_equal(r.tokens, tokens[:n]):
                self._forget(namespace, rid)
        self._ids += 1
        record = Record(np.array(tokens, dtype=np.int32), layout)
        self.by_namespace.setdefault(namespace, {})[self._ids] = record
        self.records[(namespace, self._ids)] = record
        self.tokens += len(record.tokens)
        while len(self.by_namespace[namespace]) > self.per_namespace:
            self._forget(namespace, next(iter(self.by_namespace[namespace])))
        while self.tokens > self.max_tokens and len(self.records) > 1:
            self._forget(*next(iter(self.records)))

    def closest(self, namespace: str, prompt: np.ndarray) -> Record | None:
        """The record sharing the longest prefix with `prompt`, the newest among equals."""
        best, length = None, -1
        for record in self.by_namespace.get(namespace, {}).values():  # oldest first
            n = common_prefix(record.tokens, prompt)
            if n >= length:
                best, length = record, n
        return best

    def explain(
        self,
        namespace: str,
        prompt: np.ndarray,
        layout: PromptLayout,
        restored: int,
        stored: Callable[[], int],
    ) -> Miss | None:
        """The Miss of a new prompt of `namespace` restored at `restored`; None when it
        restores all an earlier prompt offered, or there is none."""
        earlier = self.closest(namespace, prompt)
        if earlier is None:
            return None
        return explain(prompt, layout, restored, earlier, stored)

    def _forget(self, namespace: str, rid: int) -> None:
        record = self.by_namespace[namespace].pop(rid)
        del self.records[(namespace, rid)]
        if not self.by_namespace[namespace]:
            del self.by_namespace[namespace]
        self.tokens -= len(record.tokens)

    def check(self) -> None:
        """Assert the log's bounds and bookkeeping."""
        assert sum(len(r.tokens) for r in self.records.values()) == self.tokens
        assert self.tokens <= self.max_tokens or len(self.records) <= 1
        assert {k for k in self.records} == {
            (ns, rid) for ns, group in self.by_namespace.items() for rid in group
        }
        assert all(0 < len(g) <= self.per_namespace for g in self.by_namespace.values())
