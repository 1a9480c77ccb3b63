"""What a request leaves in the RAM tier: its entries staged, committed, entered with Orders.

A finished request's entries (engine.runtime.tier.finished_entries), an anchor
captured mid-prefill, and a prompt end another request waits for (stored while
its request decodes: `want_prompt_end`, `prompt_end`), wait aside in the RAM tier
under a staging key (`RamTier.stage`) while their Commit goes to the cache manager through the order
ledger; the Orders answering it bring them in (`RamTier.enter`, then the Orders
apply), so the tier holds no entry before the frees that make its room. A request
that stores nothing gives its plan back (`release`).

It knows the tier, the ledger and the stored forms; it knows nothing of the batch
(the Generator hands it the caches a sequence leaves and the bytes the batch copied)
nor of the events a request's end sends (the Generator's, once the Orders came).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from engine.cache.messages import AnchorCommit, Orders, PromptEndCommit, Release
from engine.cache.shared_rows import prefix_source
from engine.config import CacheConfig
from engine.runtime import layer_caches
from engine.runtime.active import ActiveRequest
from engine.runtime.ordering import OrderLedger
from engine.runtime.packed_state import pack_snapshot
from engine.runtime.requests import GenerationRequest
from engine.runtime.tier.finished_entries import finished_entries
from engine.runtime.tier.ram import Prefix, RamTier, StoredEntry, digest

log = logging.getLogger(__name__)


WANTED, STORING, INDEXED = range(3)  # a prompt end asked for early: where it stands


def staging_key(request_id: str, entry_id: int) -> str:
    """The key a commit's new entries wait under in the RAM tier until its Orders come."""
    return f"{request_id}#{entry_id}"


class Commits:
    """A replica's commits: what its requests leave, staged until the Orders answer."""

    def __init__(self, config: CacheConfig, tier: RamTier, ledger: OrderLedger):
        self.config = config
        self.tier = tier
        self.ledger = ledger
        # Prompt ends asked for early, by request id: [entry id, state (WANTED, STORING,
        # INDEXED), callbacks told once it is indexed ("stored") or the request is over
        # ("ended")].
        self.wanted: dict[str, list] = {}

    def anchor(self, act: ActiveRequest, point, extracted: list) -> None:
        """Store an anchor the moment prefill reaches it, and index it now.

        Requests waiting on the same system prompt restore it at once instead of
        prefilling it again. Costs one copy of the anchor's rows (the extraction),
        once per distinct system prompt.
        """
        layers, state = layer_caches.store_entry(extracted)
        layers = layer_caches.pack_rows(layers, self.config.stored_kv_precision)
        state = pack_snapshot(state, self.config.stored_precision)
        key = staging_key(act.req.request_id, point.entry_id)
        tokens = np.asarray(act.req.tokens[: point.length], dtype=np.int32)
        anchor = StoredEntry(layers, point.length, {point.length: state}, tokens=tokens)
        act.anchor = (point.entry_id, point.length)
        anchor.digests[point.length] = digest(act.req.tokens[: point.length])
        self.tier.stage(key, [(point.entry_id, anchor)], point.length)
        self.ledger.commit_anchor(
            AnchorCommit(
                request_id=act.req.request_id,
                namespace=act.req.namespace,
                entry_id=point.entry_id,
                tokens=tokens,
                kv_bytes_per_token=layer_caches.kv_bytes_per_token(layers),
                state_bytes=state.nbytes,
            ),
            lambda orders: self.enter(key, orders),
        )

    def want_prompt_end(self, request_id: str, entry_id: int, told: Callable[[str], None]):
        """A request waits for `request_id`'s prompt end: store it under `entry_id` as soon as
        that request has it (`prompt_end`); `told(outcome)` once it is indexed, or once the
        request is over and its commit or release answered."""
        want = self.wanted.setdefault(request_id, [entry_id, WANTED, []])
        if want[1] == INDEXED:
            return told("stored")
        want[2].append(told)

    def unwant_prompt_end(self, request_id: str, told: Callable[[str], None]) -> None:
        """That waiter gave up; with no waiter left, the prompt end is not stored early."""
        want = self.wanted.get(request_id)
        if want is not None and told in want[2]:
            want[2].remove(told)
            if want[1] == WANTED and not want[2]:
                del self.wanted[request_id]

    def prompt_end(self, act: ActiveRequest, request_id: str, extract: Callable) -> None:
        """Store `act`'s prompt end now, if it is asked for and not stored yet: its prompt's
        rows (of `extract()`, its caches taken out of the batch at any point of its decode:
        rows [:prompt_len] are the prompt's; None when it is not decoding), the state and
        the log-probabilities taken at its prompt end; indexed at once (a PromptEndCommit),
        its waiters told then."""
        want = self.wanted.get(request_id)
        if want is None or want[1] != WANTED or act.prompt_end_state is None:
            return
        L, entry_id = act.prompt_len, want[0]
        try:
            extracted = extract()
            if not extracted:
                return
            want[1] = STORING
            layers, _ = layer_caches.store_entry(extracted)  # its state now is past the prompt
            # The prompt's rows only, in buffers of their own: mid-decode the extraction
            # holds the reply's rows too, which the entry (L tokens) is not charged for.
            layers = layer_caches.join_rows([(layers, L)])
            layers = layer_caches.pack_rows(layers, self.config.stored_kv_precision)
            state = pack_snapshot(act.prompt_end_state, self.config.stored_precision)
        except Exception:  # its waiters wait for its commit instead; the batch goes on
            log.exception("request %s: storing its prompt end failed", request_id)
            return self._over(request_id, "failed")
        logits = {} if act.prompt_end_logits is None else {L: act.prompt_end_logits}
        tokens = np.asarray(act.req.tokens, dtype=np.int32)
        entry = StoredEntry(layers, L, {L: state}, logits, tokens)
        entry.digests[L] = digest(act.req.tokens)
        key = staging_key(request_id, entry_id)
        self.tier.stage(key, [(entry_id, entry)], L)
        commit = PromptEndCommit(
            request_id=request_id,
            namespace=act.req.namespace,
            entry_id=entry_id,
            tokens=tokens,
            kv_bytes_per_token=layer_caches.kv_bytes_per_token(layers),
            state_bytes=state.nbytes,
            logits_at=L if logits else None,
            logits_bytes=sum(a.nbytes for a in logits.values()),
        )

        def on_orders(orders: Orders) -> None:
            self.enter(key, orders)
            want[1] = INDEXED
            _tell(want[2], "stored")
            want[2].clear()

        self.ledger.commit_anchor(commit, on_orders)

    def forget_wants(self) -> None:
        """The tier was emptied (the manager restarted): every waiter plans again."""
        for request_id in list(self.wanted):
            self._over(request_id)

    def _over(self, request_id: str, outcome: str = "ended") -> None:
        """The request's commit or release is answered: its waiters plan again."""
        want = self.wanted.pop(request_id, None)
        _tell(want[2] if want is not None else (), outcome)

    def finish(
        self,
        act: ActiveRequest,
        cache: list,
        all_tokens: list,
        batch_copied: int,
        answered: Callable[[float], None],
        failed: Callable[[str], None],
    ) -> None:
        """Stage the entries `act` leaves (its sequence's `cache` over `all_tokens`) and send
        their Commit; `answered(commit_ms)` once the Orders came and they entered the tier.
        When building them fails, nothing is staged: its plan is released, `failed(error)`."""
        t0 = time.perf_counter()
        key = staging_key(act.req.request_id, act.req.plan.new_entry_id)
        cfg = self.config
        try:
            finished = finished_entries(
                act,
                cache,
                all_tokens,
                cfg.stored_precision,
                self._prefix(act),
                cfg.stored_kv_precision,
            )
        except Exception as e:  # the stream still ends, and the ids go back
            log.exception("request %s: storing its cache failed", act.req.request_id)
            self.release(act.req)
            return failed(f"{type(e).__name__}: {e}")
        # Its snapshots' copies, and the batch's copying extractions (several sequences
        # finishing at once, an anchor mid-prefill).
        act.copied_commit = finished.copied + batch_copied
        self.tier.stage(key, finished.entries, finished.tokens)

        def on_orders(orders: Orders) -> None:
            self.enter(key, orders)
            self._over(act.req.request_id)
            answered((time.perf_counter() - t0) * 1000)

        self.ledger.commit(finished.commit, on_orders)

    def _prefix(self, act: ActiveRequest) -> Prefix | None:
        """The entry `act`'s new entry reads its first rows from (the anchor it stored, or
        the restore source that stays: engine.cache.shared_rows), if the tier holds it."""
        found = prefix_source(act.req.plan.shares, act.anchor, self.config.shared_rows_min)
        held = self.tier.held(found[0]) if found is not None else None
        if held is None or held.length < found[1]:
            return None
        return Prefix(found[0], held, found[1])

    def release(self, req: GenerationRequest) -> None:
        """Give a request's plan back to the manager, storing nothing (its ids are freed)."""
        if req.plan.new_entry_id is None:
            # Nothing of it was asked for early (no plan without an entry is): a later branch,
            # whose request id is its first branch's, ends no wait for that one's prompt end.
            return

        def on_orders(orders: Orders) -> None:
            self.tier.apply(orders)
            self._over(req.request_id)

        self.ledger.release(Release(request_id=req.request_id), on_orders)

    def enter(self, key: str, orders: Orders) -> None:
        """A commit's answer: its staged entries enter the tier, then its Orders apply (in
        one loop-thread call: their moves and writes need the new entries, their frees
        make its room)."""
        self.tier.enter(key)
        self.tier.apply(orders)  # notes the tier's peak


def _tell(callbacks, outcome: str) -> None:
    """Tell each waiter `outcome`; one that fails (its caller's event loop closed) is logged,
    and neither the others nor the request's own answer are kept from theirs."""
    for told in list(callbacks):
        try:
            told(outcome)
        except Exception:
            log.exception("a waiter for a prompt end could not be told %r", outcome)
