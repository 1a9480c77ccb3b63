"""The fake model actor, shaped like a hybrid model's layout, and the token helpers.

`HybridLayout` is a kilobyte-sized hybrid model (a few attention layers, more
state layers); `KVPT` and `STATE` are its bytes per token and per state
snapshot, `entry_bytes` an entry's bytes as the index counts them, `tokens`
builds token arrays. `FakeModelActor` stores "entries" as token arrays plus the
lengths at which it holds a state snapshot, keyed by entry id, and applies
Orders. As the real RAM tier, it keeps a new entry aside under a staging key
until the Orders answering its commit arrive, and it enters with them. It
asserts it is never told to restore, move or drop something it does not hold.
It knows the cache's messages; nothing of the manager or of the disk tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.cache.messages import (
    CapturedPoint,
    Commit,
    Orders,
    RestorePlan,
)
from engine.cache.shared_rows import prefix_source
from engine.config import CacheConfig


@dataclass(frozen=True)
class HybridLayout:
    """A kilobyte-sized hybrid model: a few GQA layers plus Gated-DeltaNet-like state layers."""

    attention_layers: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    state_layers: int = 12
    state_heads: int = 2
    conv_window: int = 4
    conv_channels: int = 128
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:  # keys + values of every attention layer
        return self.attention_layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def state_bytes(self) -> int:  # recurrent matrix + conv window of every state layer
        recurrent = self.state_heads * self.head_dim * self.head_dim
        per_layer = recurrent + self.conv_window * self.conv_channels
        return self.state_layers * per_layer * self.dtype_bytes


LAYOUT = HybridLayout()
KVPT = LAYOUT.kv_bytes_per_token  # 1 KiB per token
STATE = LAYOUT.state_bytes  # 60 KiB per state snapshot


def entry_bytes(tokens: int, checkpoints: int = 0) -> int:
    """RAM bytes of an entry of `tokens` tokens with `checkpoints` checkpoints."""
    return tokens * KVPT + STATE * (1 + checkpoints)


def tokens(*parts) -> np.ndarray:
    """Concatenate ints, ranges and arrays into one int32 token array."""
    arrays = [np.asarray(list(p) if isinstance(p, range) else p, dtype=np.int32) for p in parts]
    return np.concatenate([np.atleast_1d(a) for a in arrays]) if arrays else np.zeros(0, np.int32)


@dataclass
class Stored:
    tokens: np.ndarray
    states: set[int]  # lengths with a state snapshot, the full length included
    logits: set[int] = field(default_factory=set)  # lengths with the last position's logits
    # (entry id, length): its first rows are that entry's (engine.cache.shared_rows)
    prefix: tuple[int, int] | None = None


@dataclass
class FakeModelActor:
    """Holds entries by id and obeys Orders; asserts on every order it cannot carry out."""

    state_layers: bool = True
    stored: dict[int, Stored] = field(default_factory=dict)
    # Bytes of the prompt end's log-probabilities each commit reports. 0 keeps the
    # budget tables in whole conversations; test_cache_budgets sets it to count them.
    logits_bytes: int = 0
    # New entries waiting for their commit's Orders, by staging key (RamTier.stage).
    staged: dict[str, list[tuple[int, Stored]]] = field(default_factory=dict)
    # Store new entries at once, as the RAM tier did before it staged them (a test
    # shows what that costs).
    eager: bool = False
    # A restore of at least this many tokens is read, not copied (CacheConfig.shared_rows_min)
    shared_rows_min: int = CacheConfig().shared_rows_min

    @property
    def nbytes(self) -> int:
        """The bytes held, as the index counts them (Entry.nbytes)."""
        return sum(self.bytes_of(i) for i in self.stored)

    def bytes_of(self, entry_id: int) -> int:
        """One entry's bytes, as the index counts them: rows, states, log-probabilities."""
        e = self.stored[entry_id]
        state = STATE if self.state_layers else 0
        rows = len(e.tokens) - (e.prefix[1] if e.prefix else 0)
        return rows * KVPT + state * len(e.states) + self.logits_bytes * len(e.logits)

    def held(self, entry_id: int | None) -> Stored | None:
        """The entry under `entry_id`, stored or staged (RamTier.held)."""
        if entry_id in self.stored:
            return self.stored[entry_id]
        return next((e for es in self.staged.values() for i, e in es if i == entry_id), None)

    def enter(self, key: str | None) -> None:
        """The Orders of a commit arrived: its staged entries are stored (before applying)."""
        for entry_id, entry in self.staged.pop(key, []) if key is not None else []:
            assert entry_id not in self.stored, f"entry id {entry_id} stored twice"
            self.stored[entry_id] = entry

    def restore(self, plan: RestorePlan, prompt: np.ndarray) -> None:
        """Take the plan's restore point: rows [:length] and (with state layers) its state."""
        if plan.entry_id is None:
            assert plan.length == 0 and plan.kind == "none"
            return
        held = self.stored.get(plan.entry_id)
        assert held is not None, f"restore from entry {plan.entry_id}, which is not held"
        assert plan.length < len(prompt) or (
            plan.length == len(prompt) and plan.length in held.logits
        ), "the model needs one uncached token, or the prompt end's logits"
        assert plan.length <= len(held.tokens)
        n = plan.length
        assert np.array_equal(held.tokens[:n], prompt[:n]), "restored rows differ"
        if self.state_layers:
            assert plan.length in held.states, f"no state at {plan.length} in entry {plan.entry_id}"

    def prefill(
        self,
        plan: RestorePlan,
        prompt: np.ndarray,
        reply=(),
        taken: int | None = None,
        upto: int | None = None,
        anchor: tuple[int, int] | None = None,
    ):
        """Prefill from the restore point, taking the first `taken` capture points (all when None).

        `anchor`: (entry id, length) of an anchor this prefill stored mid-way (the
        driver's `capture_anchor`); the new entry reads its first rows from it or from
        a restore source that stays, by the model actor's rule (engine.cache.shared_rows).

        `upto`: the request is cancelled after prefilling that many prompt tokens;
        it commits that prefix (no reply) with the captures reached. Returns the
        Commit when the plan stores an entry (None when the cache is off).
        """
        key = plan.request_id
        points = plan.captures if taken is None else plan.captures[:taken]
        if upto is not None:
            assert plan.length < upto < len(prompt) and len(reply) == 0
            prompt = prompt[:upto]
            points = [p for p in points if p.length <= upto]
        checkpoints = set()
        for point in points:
            assert plan.length < point.length <= len(prompt), point
            if point.entry_id is None:
                checkpoints.add(point.length)
            else:
                self.store_capture(point.entry_id, prompt, point.length, key)
                if point.kind == "anchor" and (anchor is None or point.length > anchor[1]):
                    anchor = (point.entry_id, point.length)
        if plan.new_entry_id is None:
            return None
        reply = np.asarray(reply, dtype=np.int32)
        stored = np.concatenate([prompt, reply]) if plan.store_reply else prompt
        states = checkpoints | {len(stored)} | ({len(prompt)} if plan.store_reply else set())
        # Kept when prefill reached the end, where a resend can use them (lineage mode).
        logits_at = len(prompt) if upto is None and plan.store_reply else None
        prefix = prefix_source(plan.shares, anchor, self.shared_rows_min)
        held = self.held(prefix[0]) if prefix is not None else None
        if held is None or len(held.tokens) < prefix[1] or prefix[1] >= len(stored):
            prefix = None
        self._store(plan.new_entry_id, stored, states, key, logits_at, prefix)
        return Commit(
            request_id=plan.request_id,
            namespace="",  # the driver fills it in
            entry_id=plan.new_entry_id,
            tokens=stored,
            prompt_len=len(prompt),
            restored_from=plan.entry_id,
            restored_length=plan.length,
            captures=tuple(CapturedPoint(p.length, p.kind, p.entry_id) for p in points),
            kv_bytes_per_token=KVPT,
            state_bytes=STATE if self.state_layers else 0,
            logits_at=logits_at,
            logits_bytes=self.logits_bytes,
            prefix=prefix,
        )

    def store_capture(self, entry_id: int, prompt: np.ndarray, length: int, key: str) -> None:
        """Stage a separate-entry capture (anchor, exact snapshot) taken during prefill."""
        self._store(entry_id, prompt[:length], {length}, key)

    def _store(
        self, entry_id, stored: np.ndarray, states: set[int], key: str, logits_at=None, prefix=None
    ):
        assert entry_id not in self.stored, f"entry id {entry_id} stored twice"
        entry = Stored(stored.copy(), set(states), {logits_at} - {None}, prefix)
        self.staged.setdefault(key, []).append((entry_id, entry))
        if self.eager:
            self.enter(key)

    def apply(self, orders: Orders) -> None:
        """Obey orders in field order: moves, checkpoint drops, frees.

        A move copies, as the real RAM tier does (it shares the immutable
        arrays): the source keeps its state until it is freed, so a request
        pinning it still restores there.
        """
        for move in orders.moves:
            src, dst = self.stored.get(move.src), self.stored.get(move.dst)
            assert src is not None and dst is not None, f"move {move}: entry not held"
            assert move.length in src.states, f"move {move}: no state there"
            assert move.length <= len(dst.tokens) and move.length not in dst.states
            n = move.length
            assert np.array_equal(src.tokens[:n], dst.tokens[:n]), "move across lineages"
            dst.states.add(move.length)
        for entry_id, length in orders.drop_checkpoints:
            held = self.stored.get(entry_id)
            assert held is not None and length in held.states, f"drop {entry_id}@{length}: not held"
            assert length != len(held.tokens), "a drop never takes an entry's own state"
            held.states.remove(length)
            held.logits.discard(length)
        for entry_id in orders.rejoin:
            held = self.stored.get(entry_id)
            assert held is not None and held.prefix is not None, f"rejoin {entry_id}: no prefix"
            held.prefix = None
        for entry_id in orders.free:
            self.stored.pop(entry_id, None)  # ids a request never stored are freed blindly
        for entry_id, held in self.stored.items():  # a prefix entry leaves after its readers
            assert held.prefix is None or held.prefix[0] in self.stored, (
                f"entry {entry_id} reads rows of {held.prefix[0]}, freed without a rejoin"
            )
