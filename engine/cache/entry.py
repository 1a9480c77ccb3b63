"""Entries and checkpoints as the index sees them: token ids, lengths, kinds, bytes.

An entry stands for what the model actor stores under its id: the
append-only rows of its tokens plus one state snapshot at its full length,
and a checkpoint per earlier length (the state snapshot only, reading its
rows from the entry). The index never holds the tensors themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.cache.kinds import CheckpointKind, RestoreKind, Role
from engine.cache.messages import Commit

# The restore kind reported when a request restores at an entry's own state.
_WHOLE_KIND = {
    Role.CONVERSATION: RestoreKind.ENTRY,
    Role.ANCHOR: RestoreKind.ANCHOR,
    Role.SNAPSHOT: RestoreKind.ENTRY,
}


@dataclass(frozen=True)
class Checkpoint:
    """A state snapshot at `length`, placed by the event its kind names."""

    length: int
    kind: CheckpointKind


@dataclass
class Entry:
    """One stored entry. Mutable only through the index (touch, checkpoints)."""

    id: int
    namespace: str
    role: Role
    tokens: np.ndarray  # int32, the tokens the entry covers
    prompt_len: int  # the prompt end (last turn boundary); == len(tokens) unless a reply follows
    kv_bytes_per_token: int
    state_bytes: int
    checkpoints: dict[int, Checkpoint] = field(default_factory=dict)  # by length, all < len(tokens)
    last_used: int = 0  # the index's clock at the latest touch
    # The prompt end's log-probabilities are held (RAM only; never in a file):
    # a prompt equal to tokens[:logits_at] restores there whole.
    logits_at: int | None = None
    logits_bytes: int = 0
    # The indexed entry whose rows [:prefix_len] this one reads as its own first rows
    # (engine.cache.shared_rows); None: it holds every row. The index keeps it true:
    # when that entry leaves, this one holds (and counts) every row again.
    prefix_id: int | None = None
    prefix_len: int = 0

    @classmethod
    def committed(cls, c: Commit, entry_id: int, role: Role, tokens: np.ndarray) -> "Entry":
        """The entry a commit stores under `entry_id`: its own, or a separate capture's."""
        prompt_len = c.prompt_len if role == Role.CONVERSATION else len(tokens)
        sizes = c.kv_bytes_per_token, c.state_bytes
        entry = cls(entry_id, c.namespace, role, tokens, prompt_len, *sizes)
        if role == Role.CONVERSATION and c.logits_at == prompt_len:
            entry.logits_at, entry.logits_bytes = prompt_len, c.logits_bytes
        if entry_id == c.entry_id and c.prefix is not None:
            entry.prefix_id, entry.prefix_len = c.prefix
        return entry

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """RAM bytes: the entry's own rows (not its prefix entry's) and state, plus one
        state per checkpoint."""
        rows = (self.length - self.prefix_len) * self.kv_bytes_per_token
        logits = self.logits_bytes if self.logits_at is not None else 0
        return rows + self.state_bytes * (1 + len(self.checkpoints)) + logits

    def prompt_end_kind(self) -> str:
        """The restore kind of a restore at `logits_at` (the prompt end)."""
        if self.logits_at == self.length:
            return _WHOLE_KIND[self.role]
        return self.checkpoints[self.logits_at].kind

    def restore_point(self, lcp: int, has_state_layers: bool) -> tuple[int, str] | None:
        """The longest (length, kind) restorable from this entry within `lcp` shared tokens.

        The whole entry when it is all shared; else its longest checkpoint at or
        before `lcp`; on a model with no state layers, `lcp` itself (rows alone
        restore anywhere). None when nothing (of positive length) is restorable.
        """
        if lcp == self.length:
            return self.length, _WHOLE_KIND[self.role]
        if not has_state_layers:
            return (lcp, _WHOLE_KIND[self.role]) if lcp > 0 else None
        within = [n for n in self.checkpoints if n <= lcp]
        if not within:
            return None
        best = max(within)
        return best, self.checkpoints[best].kind

    def check(self) -> None:
        """Assert the entry's own invariants."""
        assert self.role in tuple(Role), self.role
        assert self.tokens.dtype == np.int32 and self.tokens.ndim == 1 and self.length > 0
        assert 0 < self.prompt_len <= self.length, (self.prompt_len, self.length)
        assert self.kv_bytes_per_token >= 0 and self.state_bytes >= 0
        for n, checkpoint in self.checkpoints.items():
            assert checkpoint.length == n and 0 < n < self.length, (self.id, n)
        if self.logits_at is not None:  # the prompt end, with a state there
            assert self.logits_at == self.prompt_len, (self.id, self.logits_at)
            assert self.logits_at == self.length or self.logits_at in self.checkpoints
        if self.role != Role.CONVERSATION:
            assert not self.checkpoints, (self.id, self.role)
        if self.prefix_id is None:
            assert self.prefix_len == 0, (self.id, self.prefix_len)
        else:
            assert 0 < self.prefix_len < self.length, (self.id, self.prefix_len)
