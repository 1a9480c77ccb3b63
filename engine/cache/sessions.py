"""Session keys: which replica served each conversation last.

A client that names its conversation (an `x-session-id` header, OpenAI's
`prompt_cache_key` or `user`, Anthropic's `metadata.user_id`, a Responses
`previous_response_id`) sends each turn with the same key; routing its turns
to one replica keeps them where their cache is even when a lookup finds
nothing to restore there (a changed system prompt, a cold cache, the exact
mode). A key is always scoped by its namespace: the same key from two tenants
is two sessions, so one tenant's key can neither steer nor learn another's
placement. Bounded: the least recently used keys go past `max_keys` (a key
is remembered whatever the tiers hold, so this bound is what holds them; with
one replica the keys route nothing and none is kept).
It decides nothing: engine.cache.replicas routes with it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

MAX_SESSIONS = 1 << 16  # keys remembered, over every namespace


class Sessions:
    """(namespace, session key) -> replica, least recently used first."""

    def __init__(self, max_keys: int = MAX_SESSIONS) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self.replica_of: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.moves: Counter[int] = Counter()  # sessions moved off each replica

    def get(self, namespace: str, session: str) -> int | None:
        """The replica that served this session last, if known."""
        return self.replica_of.get((namespace, session))

    def served(self, namespace: str, session: str, replica: int) -> None:
        """The session's request went to `replica`: it stays there for the next turn."""
        key = (namespace, session)
        before = self.replica_of.pop(key, None)
        if before is not None and before != replica:
            self.moves[before] += 1
        self.replica_of[key] = replica
        while len(self.replica_of) > self.max_keys:
            self.replica_of.popitem(last=False)

    def counts(self) -> Counter[int]:
        """Session keys per replica."""
        return Counter(self.replica_of.values())
