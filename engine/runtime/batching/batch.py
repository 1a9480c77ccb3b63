"""mlx-lm's BatchGenerator, with the copies and pool clears of a warm turn taken out.

Four changes to mlx-lm's batches, everything else is mlx-lm's:

- The batch merge of restored caches is the only KV copy of a warm turn: the
  merged KV buffer gets room for the rest of the prompt, so prefill writes in
  place instead of concatenating (a second whole-KV copy) on its first chunk.
- Moving sequences from prefill to decode (`split`) no longer deep-copies the
  whole prompt batch's caches: the caches move when every sequence leaves,
  and only the leaving rows are gathered otherwise.
- A sequence that finishes alone in the batch leaves with views of its KV
  rows, not a copy (`extract_alone`): the commit copies nothing.
- The `mx.clear_cache()` after every prefill chunk and padded batch is opt-in.
  It hands MLX's buffer pool back to the operating system, so the next
  allocation page-faults fresh memory: on a warm turn that made each KV copy
  many times slower (`lineage bench warm` shows it). The pool stays,
  bounded by MLX's cache limit, and is released when the engine goes idle.

What copies remain is counted per sequence: the merge (`restore_copies`), the
copying extractions (`commit_copies`), and every filter, extend and buffer
growth of mlx-lm's batch caches (`ledger`, engine.runtime.batching.copies).
"""

from __future__ import annotations

import copy

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch, _right_pad_prompts
from mlx_lm.models.cache import ArraysCache, BatchKVCache, CacheList, KVCache

from engine.config.memory import pool_limit
from engine.runtime.batching.copies import CopyLedger
from engine.runtime.layer_caches import snapshot_state
from engine.runtime.packed_state import unpack_joined
from engine.runtime.speculative.speculative_batch import SpeculativeGenerationBatch
from engine.runtime.structured.masked_batch import LineageGenerationBatch


def merge_with_room(caches: list, room: int, copied: list | None = None) -> list:
    """mlx-lm's batch merge, with KV buffers sized for `room` more tokens.

    The merge copies each restored sequence's KV rows into the batch layout
    (the one copy a warm turn pays); sizing the buffer for what prefill will
    append lets BatchKVCache write in place instead of concatenating.
    `copied[i]` grows by the bytes copied of sequence i (KV rows and state).
    """
    if not caches:
        return []
    copied = copied if copied is not None else [0] * len(caches)
    return [_merge_layer([c[i] for c in caches], room, copied) for i in range(len(caches[0]))]


def _state_bytes(cache) -> int:
    return sum(a.nbytes for _, a in tree_flatten(cache.state) if isinstance(a, mx.array))


def _merge_layer(layers: list, room: int, copied: list):
    if all(type(c) is KVCache for c in layers):
        return _merge_kv(layers, room, copied)
    if all(type(c) is CacheList for c in layers):
        parts = zip(*(c.caches for c in layers))
        merged = CacheList()
        merged.caches = tuple(_merge_layer(list(p), room, copied) for p in parts)
        return merged
    if all(type(c) is ArraysCache and getattr(c, "packed", None) for c in layers):
        return _merge_packed(layers, copied)
    if not hasattr(layers[0], "merge"):
        raise ValueError(f"{type(layers[0]).__name__} does not support batching with history")
    for i, c in enumerate(layers):  # mlx-lm's merge concatenates: every state is copied
        copied[i] += _state_bytes(c)
    return layers[0].merge(layers)


def _merge_packed(layers: list, copied: list) -> ArraysCache:
    """mlx-lm's ArraysCache merge for states restored from packed checkpoints: each
    state's packed forms joined, then unpacked once (engine.runtime.packed_state), not
    unpacked per sequence and copied again into the batch. A slot whose forms are not
    all packed alike is unpacked and joined."""
    merged = ArraysCache(len(layers[0].cache))
    for e in range(len(merged.cache)):
        parts = [c.packed[e] for c in layers]
        joined = unpack_joined(parts)
        if joined is None:
            if any(c.cache[e] is None for c in layers):
                return layers[0].merge(layers)  # mlx-lm's merge fills an empty state
            joined = mx.concatenate([c.cache[e] for c in layers], axis=0)
        merged.cache[e] = joined
    for i, c in enumerate(layers):
        copied[i] += _state_bytes(c)
    return merged


class LineageBatchKVCache(BatchKVCache):
    """mlx-lm's BatchKVCache that knows on the host whether any row is padded.

    mlx-lm builds an array mask for every forward of a batch cache, a decode
    step's one token included; the rows of a decode step that are all
    unpadded need none (a single stream, or rows of equal length), as a plain
    KVCache's decode has none. Measured: the mask is ~4% of a decode step's CPU
    at one stream on the embedded model. Left padding changes in `prepare`,
    `finalize`, `filter` and `extend`; `padded` stays true whenever a row may
    have padding (never false while one has). Chunks of several tokens keep
    mlx-lm's mask (the kernels read it).
    """

    def __init__(self, left_padding: list[int]):
        super().__init__(left_padding)
        self.padded = any(left_padding)

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None):
        super().prepare(left_padding=left_padding, lengths=lengths, right_padding=right_padding)
        if left_padding is not None and any(left_padding):
            self.padded = True

    def finalize(self):
        rolled = self._right_padding is not None  # the right padding becomes left padding
        super().finalize()
        self.padded = self.padded or rolled

    def filter(self, batch_indices):
        super().filter(batch_indices)  # shifts the rows left by the least padding
        self.padded = self.padded and len(batch_indices) > 1

    def extend(self, other):
        # The shorter side is padded on the left to the longer one's length.
        padded = self.padded or getattr(other, "padded", True) or self._idx != other._idx
        super().extend(other)
        self.padded = padded

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        if N == 1 and not return_array and not self.padded and self._right_padding is None:
            if not kwargs.get("window_size"):
                return None
        return super().make_mask(N, return_array=return_array, **kwargs)


def _merge_kv(layers: list, room: int, copied: list) -> BatchKVCache:
    lengths = [c.size() for c in layers]
    longest = max(lengths)
    if longest == 0:
        return LineageBatchKVCache([0] * len(layers))
    ref = next(c for c in layers if c.keys is not None)
    step = BatchKVCache.step
    capacity = ((longest + room + step - 1) // step) * step
    B, H = len(layers), ref.keys.shape[1]
    keys = mx.zeros((B, H, capacity, ref.keys.shape[3]), dtype=ref.keys.dtype)
    values = mx.zeros((B, H, capacity, ref.values.shape[3]), dtype=ref.values.dtype)
    padding = [longest - n for n in lengths]
    for i, (p, c) in enumerate(zip(padding, layers)):
        if c.keys is None or not c.offset:
            continue
        # A restore over several stored segments (engine.runtime.layer_caches) writes
        # each into place: its joined `keys` is never evaluated.
        segments = getattr(c, "segments", None)
        if not segments or sum(k.shape[2] for k, _ in segments) != c.offset:
            segments = ((c.keys, c.values),)  # one buffer (or rows written since)
        at = p
        for seg_k, seg_v in segments:
            rows = min(seg_k.shape[2], p + c.offset - at)
            rows_k, rows_v = seg_k[..., :rows, :], seg_v[..., :rows, :]
            keys[i : i + 1, :, at : at + rows] = rows_k
            values[i : i + 1, :, at : at + rows] = rows_v
            copied[i] += rows_k.nbytes + rows_v.nbytes
            at += rows
    merged = LineageBatchKVCache(padding)
    merged.keys, merged.values = keys, values
    merged.offset = merged.offset + longest
    merged._idx = longest
    return merged


def _detached(cache):
    """A shallow copy whose in-place `filter` leaves the original untouched."""
    if type(cache) is CacheList:
        out = CacheList()
        out.caches = tuple(_detached(c) for c in cache.caches)
        return out
    return copy.copy(cache)


def bound_pool(ram_budget: int, configured: int | None = None) -> int:
    """Bound the pool that the warm path keeps (instead of clearing it per chunk), at the
    memory shares' limit (engine.config.memory.pool_limit)."""
    limit = pool_limit(ram_budget, configured)
    mx.set_cache_limit(limit)
    return limit


class PoolClearCounter:
    """Counts the pool clears the batch makes (the tests read it)."""

    def __init__(self):
        self.count = 0

    def clear(self) -> None:
        self.count += 1
        mx.clear_cache()


class LineagePromptBatch(PromptProcessingBatch):
    """PromptProcessingBatch whose per-chunk pool clear happens only when asked.

    The batch generator sets the fields below once, on its first prompt batch; every
    batch made from it (a copy, a new prompt batch) takes them over (`share`).
    """

    SHARED = ("clear_pool", "pool", "ledger", "extracted", "forks", "tails", "matchers")
    clear_pool: bool = False
    pool: PoolClearCounter | None = None
    ledger: CopyLedger | None = None  # set by the generator: reshuffles and growth, per uid
    extracted: dict | None = None  # set by the generator: uid -> KV bytes extractions copied
    forks: dict | None = None  # set by the generator: uid -> its Branches (engine.runtime.branches)
    matchers: dict | None = None  # set by the generator: uid -> its Matcher (constrained ones)
    # set by the generator when an MTP head drafts: uid -> its prompt's last prefilled
    # positions (engine.runtime.speculative.mtp_drafts.PromptTails)
    tails = None

    def __init__(self, *args, caches=None, room: int = 0, **kwargs):
        super().__init__(*args, caches=[], **kwargs)
        counts = [0] * len(caches or [])
        self.prompt_cache = merge_with_room(caches or [], room, counts)
        self.copied = dict(zip(self.uids, counts))  # uid -> bytes its merge copied

    def share(self, source: "LineagePromptBatch") -> "LineagePromptBatch":
        """Take over the generator's fields (`SHARED`) from another prompt batch of it."""
        for name in self.SHARED:
            setattr(self, name, getattr(source, name))
        return self

    def _copy(self):
        return super()._copy().share(self)

    def filter(self, keep):
        """mlx-lm's filter (a gather of the kept rows), charged to the kept sequences."""
        if self.ledger is None:
            return super().filter(keep)
        uids = list(self.uids)
        self.ledger.filter(
            self.prompt_cache,
            uids,
            list(keep),
            lambda: super(LineagePromptBatch, self).filter(keep),
        )

    def extend(self, batch):
        """mlx-lm's extend (padded copies, a concatenation), charged to every sequence."""
        if self.ledger is None:
            return super().extend(batch)
        uids, other = list(self.uids), list(batch.uids)

        def run():
            super(LineagePromptBatch, self).extend(batch)
            return self.prompt_cache

        self.ledger.extend(self.prompt_cache, uids, batch.prompt_cache, other, run)

    def extract_cache(self, idx: int) -> list:
        """One sequence's caches, copied out of the batch layout (counted per uid)."""
        out = super().extract_cache(idx)
        if self.extracted is not None:
            uid = self.uids[idx]
            self.extracted[uid] = self.extracted.get(uid, 0) + sum(_kv_bytes(c) for c in out)
        return out

    def split(self, indices):
        """Move `indices` to a new batch without deep-copying the whole batch's caches."""
        indices = sorted(indices)
        rest = sorted(set(range(len(self.uids))) - set(indices))
        caches, self.prompt_cache = self.prompt_cache, []
        new = self._copy()  # copies no tensors now: the caches are set aside
        if rest:
            new.prompt_cache = [_detached(c) for c in caches]
            self.prompt_cache = caches
            self.filter(rest)
            new.filter(indices)
        else:
            new.prompt_cache = caches  # every sequence leaves: nothing to gather
            self.filter([])
        return new

    def generate(self, tokens):
        """mlx-lm's move to generation, into a batch that masks constrained rows
        (engine.runtime.structured.masked_batch)."""
        if any(len(t) > 1 for t in tokens):
            self.prompt([t[:-1] for t in tokens])
        last = self._branch_rows([t[-1] for t in tokens])
        generation = LineageGenerationBatch(
            self.model,
            self.uids,
            mx.array(last),
            self.prompt_cache,
            self.tokens,
            self.samplers,
            self.fallback_sampler,
            self.logits_processors,
            self.stop_sequences,
            self.max_tokens,
            matchers=self.matchers,
        )
        self.uids, self.prompt_cache, self.tokens = [], [], []
        self.samplers, self.logits_processors, self.max_tokens = [], [], []
        return generation

    def _branch_rows(self, last: list) -> list:
        """The rows of sequences with branches (engine.runtime.branches) copied once per
        branch, after every original row (mlx-lm reads the first rows as the sequences that
        ended their prompts); `last`, the tokens each row feeds next, with them."""
        forks = self.forks if self.forks is not None else {}
        extra = [(i, b) for i, uid in enumerate(self.uids) for b in forks.pop(uid, ())]
        if not extra:
            return last
        keep = list(range(len(self.uids))) + [i for i, _ in extra]

        def gather():  # each branch's KV rows and state, copied (with every kept row)
            for c in self.prompt_cache:
                c.filter(keep)

        if self.ledger is not None:  # charged to the sequences forked from
            self.ledger.filter(self.prompt_cache, list(self.uids), keep, gather)
        else:
            gather()
        self.uids = list(self.uids) + [b.uid for _, b in extra]
        self.tokens = list(self.tokens) + [list(self.tokens[i]) for i, _ in extra]
        self.samplers = list(self.samplers) + [b.sampler for _, b in extra]
        self.logits_processors = list(self.logits_processors) + [[] for _ in extra]
        if self.matchers is not None:
            self.matchers.update({b.uid: b.matcher for _, b in extra if b.matcher is not None})
        self.stop_sequences = list(self.stop_sequences) + [b.stop for _, b in extra]
        self.max_tokens = list(self.max_tokens) + [b.max_tokens for _, b in extra]
        return last + [last[i] for i, _ in extra]

    def prompt(self, tokens):
        """Run the prompt tokens through the model (mlx-lm's loop, minus the forced clears)."""
        self.forward(tokens)
        self.account()

    def forward(self, tokens):
        """`prompt`'s forwards alone: the batch's caches and tokens, nothing shared with the
        generation batch (a prefill worker thread runs this; `account` follows on the loop's).
        With an MTP head (`tails`), each sequence's last hidden states are kept for it."""
        if len(self.uids) != len(tokens):
            raise ValueError("The batch length doesn't match the number of inputs")
        if not tokens:
            return
        for sti, ti in zip(self.tokens, tokens):
            sti += ti
        lengths = [len(p) for p in tokens]
        max_length = max(lengths)
        padding = [max_length - n for n in lengths]
        if max(padding) > 0:
            tokens = _right_pad_prompts(tokens, max_length=max_length)
            for c in self.prompt_cache:
                c.prepare(lengths=lengths, right_padding=padding)
        else:
            tokens = mx.array(tokens)
        done = 0
        while tokens.shape[1] > 0:
            n = min(self.prefill_step_size, tokens.shape[1])
            if self.tails is None:
                self.model(tokens[:, :n], cache=self.prompt_cache)
                kept = []
            else:  # the trunk's hidden states: the MTP head reads the prompt's last ones
                hidden = self.model.model(tokens[:, :n], cache=self.prompt_cache)
                kept = self.tails.keep(self.uids, hidden, tokens[:, :n], lengths, done)
            mx.eval([c.state for c in self.prompt_cache] + kept)
            self._maybe_clear()
            tokens = tokens[:, n:]
            done += n
        if max(padding) > 0:
            for c in self.prompt_cache:
                c.finalize()
            mx.eval([c.state for c in self.prompt_cache])
            self._maybe_clear()

    def account(self) -> None:
        """Charge the buffer growth of the forwards since the last call to the ledger."""
        if self.ledger is not None:  # a chunk beyond the merged room grew the buffers
            self.ledger.grown(self.prompt_cache, list(self.uids))

    def _maybe_clear(self) -> None:
        if self.clear_pool and self.pool is not None:
            self.pool.clear()


def extract_alone(batch, idx: int, copies: dict | None = None) -> list:
    """A finished sequence's caches; when it is alone in the batch, its KV rows are views.

    mlx-lm's extraction copies the rows out of the batch layout (so the rest of
    the batch can be dropped). A sequence alone in an unpadded batch owns the
    whole buffer, which the batch drops right after: a view of its rows is the
    same entry without the copy (it keeps at most a step of spare rows alive).
    `copies[uid]` grows by the KV bytes a copying extraction made.
    """
    if len(batch.uids) != 1:
        out = [c.extract(idx) for c in batch.prompt_cache]
        if copies is not None:
            uid = batch.uids[idx]
            copies[uid] = copies.get(uid, 0) + sum(_kv_bytes(c) for c in out)
        return out
    return [_extract_layer(c, idx) for c in batch.prompt_cache]


def _kv_bytes(c) -> int:
    """Bytes of an extracted layer's KV arrays (mlx-lm copies them: mx.contiguous)."""
    if type(c) is CacheList:
        return sum(_kv_bytes(p) for p in c.caches)
    if type(c) is KVCache and c.keys is not None:
        return c.keys.nbytes + c.values.nbytes
    return 0


def _extract_layer(c, idx: int):
    if isinstance(c, BatchKVCache) and c.keys is not None and int(c.left_padding[0].item()) == 0:
        cache = KVCache()
        cache.keys, cache.values = c.keys[..., : c._idx, :], c.values[..., : c._idx, :]
        cache.offset = c._idx
        return cache
    if type(c) is CacheList:
        out = CacheList()
        out.caches = tuple(_extract_layer(p, idx) for p in c.caches)
        return out
    return c.extract(idx)


class LineageBatchGenerator(BatchGenerator):
    """BatchGenerator with the warm turn's copies and pool clears taken out (module doc)."""

    def __init__(self, model, *, clear_pool_per_prefill: bool = False, speculation=None, **kwargs):
        super().__init__(model, **kwargs)
        # The one generation batch lives as long as the generator (others extend it); its
        # constrained rows are masked one by one (engine.runtime.structured.masked_batch), and with
        # speculation its step verifies drafts (engine.runtime.speculative.speculative_batch).
        if speculation is not None:
            self._generation_batch = SpeculativeGenerationBatch.speculating(
                model, self.sampler, speculation
            )
        else:
            self._generation_batch = LineageGenerationBatch.empty(self.model, self.sampler)
        gen = self._generation_batch
        # uid -> the Matcher of each constrained sequence, shared by every batch of this
        # generator: a row's matcher follows its uid (engine.runtime.structured.masked_batch).
        self.matchers: dict = {}
        gen.matchers = self.matchers
        # Bytes copied per sequence uid, by the merge into a prompt batch (restore) and
        # by a copying extraction (commit); the generator takes them per request.
        self.restore_copies: dict[int, int] = {}
        self.commit_copies: dict[int, int] = {}
        # What mlx-lm's batch caches copy when the batches change shape or outgrow their
        # buffers (engine.runtime.batching.copies), per uid: `ledger.pop(uid)`.
        self.ledger = CopyLedger()
        gen.extract_cache = lambda idx: extract_alone(gen, idx, self.commit_copies)
        gen_filter, gen_extend = gen.filter, gen.extend

        def filter_generation(keep):
            self.ledger.filter(
                gen.prompt_cache, list(gen.uids), list(keep), lambda: gen_filter(keep)
            )

        def extend_generation(batch):
            def run():
                gen_extend(batch)
                return gen.prompt_cache

            self.ledger.extend(
                gen.prompt_cache, list(gen.uids), batch.prompt_cache, list(batch.uids), run
            )

        gen.filter, gen.extend = filter_generation, extend_generation
        self.pool = PoolClearCounter()
        batch = LineagePromptBatch.empty(
            self.model, self.sampler, prefill_step_size=self.prefill_step_size
        )
        batch.clear_pool = clear_pool_per_prefill
        batch.pool = self.pool
        # uid -> the Branches it forks at its prompt end (engine.runtime.branches)
        self.forks: dict[int, list] = {}
        batch.ledger, batch.extracted, batch.forks = self.ledger, self.commit_copies, self.forks
        batch.tails = getattr(self._generation_batch, "tails", None)
        batch.matchers = self.matchers
        self._prompt_batch = batch

    def next(self):
        """One step (mlx-lm's); then the decode's growth of the generation batch is charged."""
        out = super().next()
        gen = self._generation_batch
        self.ledger.grown(gen.prompt_cache, list(gen.uids))
        return out

    # The engine's view of the two batches: what the generator may read of a
    # sequence between steps. mlx-lm's private fields are touched here only.

    def generation_state(self, uid: int):
        """The state snapshot of a sequence that just entered the generation batch."""
        batch = self._generation_batch
        return snapshot_state(batch.prompt_cache, batch.uids.index(uid))

    def generation_logprobs(self, uid: int):
        """The log-probabilities a sequence that just entered the generation batch samples its
        first token from (its prompt end's; mlx-lm keeps them for the next step)."""
        batch = self._generation_batch
        unmasked = batch.unmasked.pop(uid, None)  # a constrained row's, before its mask
        return unmasked if unmasked is not None else batch._next_logprobs[batch.uids.index(uid)]

    def generation_extract(self, uid: int) -> list | None:
        """The layer caches of a decoding sequence, extracted alone (one copy of its rows);
        None when it is not in the generation batch."""
        batch = self._generation_batch
        if uid not in batch.uids:
            return None
        return batch.extract_cache(batch.uids.index(uid))

    def prefill_state(self, uid: int):
        """The state snapshot of a sequence in prefill, at its current length."""
        batch = self._prompt_batch
        return snapshot_state(batch.prompt_cache, batch.uids.index(uid))

    def prefill_extract(self, uid: int) -> list:
        """The layer caches of a sequence in prefill, extracted alone (one copy of its rows,
        counted in `commit_copies` by the batch)."""
        batch = self._prompt_batch
        return batch.extract_cache(batch.uids.index(uid))

    def draft_counts(self, uid: int) -> tuple[int, int, int]:
        """(drafts verified, drafts accepted, verify steps) of a sequence, taken once."""
        stats = getattr(self._generation_batch, "stats", None)
        counts = None if stats is None else stats.counts.pop(uid, None)
        return (0, 0, 0) if counts is None else (counts.drafted, counts.accepted, counts.verifies)

    def new_uids(self, k: int) -> list[int]:
        """`k` uids for sequences the batch will add itself (branches)."""
        uids = list(range(self._uid_count, self._uid_count + k))
        self._uid_count += k
        return uids

    def insert_segments(self, segments, *args, matchers=None, **kwargs):
        """mlx-lm's insertion; `matchers` (one per sequence, None when unconstrained) hold
        each sequence's tokens to its grammar from its first sampled token."""
        uids = super().insert_segments(segments, *args, **kwargs)
        for uid, matcher in zip(uids, matchers or ()):
            if matcher is not None:
                self.matchers[uid] = matcher
        return uids

    def remove(self, uids, return_prompt_caches=False):
        """mlx-lm's removal; a removed sequence's prompt tail (an MTP head's) and its
        matcher go too."""
        self.forget_rows(uids)
        return super().remove(uids, return_prompt_caches)

    def forget_rows(self, uids) -> None:
        """Removed sequences' books: their prompt tails (an MTP head's) and matchers."""
        for uid in uids:
            self.matchers.pop(uid, None)
        tails = self._prompt_batch.tails
        if tails is not None:
            for uid in uids:
                tails.pop(uid)

    def fork(self, uid: int, branches: list) -> None:
        """Sequence `uid` forks `branches` (engine.runtime.branches) when its prompt ends."""
        self.forks[uid] = list(branches)

    @property
    def generating(self) -> int:
        """Sequences in the generation batch."""
        return len(self._generation_batch)

    def _make_batch(self, n: int):
        """mlx-lm's _make_batch, merging the restored caches with room for the prompt."""
        sequences = [self._unprocessed_sequences.popleft() for _ in range(n)]
        batch, processing = self._prompt_batch_of(sequences)
        self._currently_processing.extend(processing)
        return batch

    def _prompt_batch_of(self, sequences: list):
        """(prompt batch, its [segments, done, total] rows) of sequences taken off the queue."""
        fields = {
            k: []
            for k in (
                "uids",
                "caches",
                "tokens",
                "samplers",
                "logits_processors",
                "max_tokens",
                "stop_sequences",
            )
        }
        room = 0
        processing = []
        for uid, segments, max_tok, cache, tokens, sampler, procs, stops in sequences:
            remaining = sum(len(s) for s in segments)
            room = max(room, remaining)
            for key, value in zip(fields, (uid, cache, tokens, sampler, procs, max_tok, stops)):
                fields[key].append(value)
            processing.append([segments, 0, remaining])
        batch = LineagePromptBatch(
            model=self.model,
            prefill_step_size=self.prefill_step_size,
            fallback_sampler=self.sampler,
            room=room,
            **fields,
        )
        batch.share(self._prompt_batch)
        self.ledger.note(batch.prompt_cache)
        self.restore_copies.update(batch.copied)
        return batch, processing
