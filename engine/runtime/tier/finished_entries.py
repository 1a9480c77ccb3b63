"""What a finished request leaves: the entries it stores and the Commit that describes them.

From the batch's layer caches of one finished (or cancelled) sequence and
the state snapshots its prefill captured, it builds the stored forms
(engine.runtime.layer_caches) keyed by entry id: the request's new entry
(over its reply too when the plan stores it, the prompt end then a
checkpoint), its checkpoints, and one entry per separate capture (an exact
snapshot). The Commit tells the cache manager what they hold. It stores
nothing: the Generator stages the entries in the RAM tier and sends the
Commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cache.messages import CapturedPoint, Commit
from engine.runtime import layer_caches
from engine.runtime.active import ActiveRequest
from engine.runtime.packed_state import pack_snapshot, pack_states
from engine.runtime.tier.ram import Prefix, StoredEntry, digest


@dataclass(frozen=True)
class FinishedEntries:
    commit: Commit
    entries: list[tuple[int, StoredEntry]]  # (entry id, entry), the new entry last
    tokens: int  # tokens the new entry covers
    copied: int  # bytes copied: the end state, the captured states, rows split off a prefix


def finished_entries(
    act: ActiveRequest,
    cache: list,
    all_tokens: list,
    precision: str = "exact",
    prefix: Prefix | None = None,
    kv_precision: str = "exact",
) -> FinishedEntries:
    """The entries and Commit of `act`, whose batch caches are `cache` over `all_tokens`;
    its snapshots kept at `precision` (engine.runtime.packed_state), its KV rows at
    `kv_precision` (layer_caches.pack_rows). With `prefix`, the
    new entry reads its first rows from that entry and keeps a copy of the rest only
    (engine.cache.shared_rows), so the buffer its rows came from is let go."""
    plan = act.req.plan
    L = act.prompt_len
    counter = layer_caches.CopyCounter()
    layers, end_state = layer_caches.store_entry(cache, counter)
    end_state = pack_snapshot(end_state, precision)
    # What the snapshot code copied (the end state), and the states captured in
    # prefill and at the prompt end (each a copy).
    snapshots = [s for _, s in act.taken.values()]
    if act.prompt_end_state is not None and not act.resent:  # a resend's is shared
        snapshots.append(act.prompt_end_state)
    tokens = np.asarray(all_tokens, dtype=np.int32)
    if act.prompt_end_state is None:  # cancelled in prefill: the prefix done so far
        L = length = int(tokens.shape[0])
        states = {length: end_state}
    elif plan.store_reply:
        length, states = int(tokens.shape[0]), {int(tokens.shape[0]): end_state}
        if length > L:
            states[L] = act.prompt_end_state
    else:
        length, states = L, {L: act.prompt_end_state}
        tokens = tokens[:L]
    assert tokens.shape[0] >= L, "the cache holds fewer tokens than the prompt"
    points, entries = [], []
    for point, state in act.taken.values():
        state = pack_snapshot(state, precision)
        if point.entry_id is None:
            states[point.length] = state
        else:
            captured = StoredEntry(
                layers, point.length, {point.length: state}, tokens=tokens[: point.length]
            )
            captured.digests[point.length] = digest(all_tokens[: point.length])
            entries.append((point.entry_id, captured))
        points.append(CapturedPoint(point.length, point.kind, point.entry_id))
    logits = {}
    # Kept where a resend can use them: a lineage entry's prompt end (exact mode's
    # snapshots are matched one token short, and its index does not count them).
    if act.prompt_end_logits is not None and L in states and plan.store_reply:
        logits = {L: act.prompt_end_logits}
    own = layers
    if prefix is not None and not prefix.length < length:
        prefix = None
    if prefix is not None:
        own = layer_caches.split_rows(layers, prefix.length, counter)
    own = layer_caches.pack_rows(own, kv_precision)
    entry = StoredEntry(own, length, pack_states(states, precision), logits, tokens, prefix=prefix)
    # Digests at its restore points, from the token list at hand (the next turn checks them).
    entry.digests = {n: digest(all_tokens[:n]) for n in states}
    entries.append((plan.new_entry_id, entry))
    # The KV bytes a token costs as stored (packed rows cost less than the batch's).
    kv_bytes_per_token = layer_caches.kv_bytes_per_token(own)
    copied = counter.copied_kv + counter.copied_state + sum(s.nbytes for s in snapshots)
    commit = Commit(
        request_id=act.req.request_id,
        namespace=act.req.namespace,
        entry_id=plan.new_entry_id,
        tokens=tokens,
        prompt_len=L,
        restored_from=plan.entry_id if act.restore_length else None,
        restored_length=act.restore_length,
        captures=tuple(points),
        kv_bytes_per_token=kv_bytes_per_token,
        state_bytes=end_state.nbytes,
        logits_at=L if logits else None,
        logits_bytes=sum(a.nbytes for a in logits.values()),
        prefix=(prefix.entry_id, prefix.length) if prefix is not None else None,
    )
    return FinishedEntries(commit, entries, length, copied)
