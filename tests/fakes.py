"""Fakes for the cache policy's tests: a model actor shaped like a hybrid model, and a driver.

The fake model actor stores "entries" as token arrays plus the set of lengths
at which it holds a state snapshot, keyed by entry id, and applies Orders. As
the real RAM tier, it keeps a new entry aside under a staging key until the
Orders answering its commit arrive, and it enters with them; a plan that
loads a file first gets the Orders that make room for it
(`CacheManager.room`). So the bytes it holds stay within the RAM budget at
every step, Orders in transit included: the driver checks that too. It
asserts it is never told to restore, move or drop something it does not hold.
The driver runs requests through a CacheManager and the fake actor and, after
every call, checks the manager's invariants and that the actor holds exactly
what the index says (plus the entries whose free waits for a pin).

Orders may travel late, as they do between actors: the driver reaches the
manager through `HeldLink`, a CacheLink whose answers queue up until
`deliver()` while `hold` is set (or while earlier ones are still in transit:
they arrive in order), and plans made meanwhile reach the actor at once. Its
calls go through the runtime's own `OrderLedger` (engine.runtime.ordering),
so the actor restores a plan by the model actor's rule, in the same code:
only once it applied every Orders up to `plan.after_orders`, or once no call
of its own is unanswered; a commit of a plan not restored yet first waits
for them. The disk tier's variants (FakeDiskActor, DiskDriver) also write,
delete and read real entry files (real headers and checksums, a dummy body)
in a directory of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from engine.cache import CacheManager
from engine.cache.messages import (
    AnchorCommit,
    CapturedPoint,
    Commit,
    LostRestore,
    Orders,
    PlanRequest,
    PromptLayout,
    Release,
    RestorePlan,
)
from engine.cache.shared_rows import prefix_source
from engine.config import CacheConfig
from engine.runtime.ordering import OrderLedger
from engine.storage import file_format, writer
from engine.storage.directory import delete_files, open_cache_directory, scan_directory


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


class HeldLink:
    """A CacheLink to an in-process CacheManager whose answers may travel late.

    An answer reaches its callback at once, or, while `hold` is set or earlier
    answers are still in transit (they arrive in order), once `deliver()`
    hands it over. `last` is the manager's latest answer, delivered or not.
    """

    def __init__(self, manager: CacheManager):
        self.manager = manager
        self.hold = False
        self.in_transit: list[tuple[Orders, Callable[[], None]]] = []
        self.last = None

    def commit(self, commit, on_orders) -> None:
        self._answer(self.manager.commit(commit), on_orders)

    def commit_anchor(self, anchor, on_orders) -> None:
        self._answer(self.manager.commit_anchor(anchor), on_orders)

    def release(self, release, on_orders) -> None:
        self._answer(self.manager.release(release), on_orders)

    def room(self, request_id, on_orders) -> None:
        self._answer(self.manager.room(request_id), on_orders)

    def replan(self, lost, on_replanned) -> None:
        replanned = self.manager.replan(lost)
        self.last = replanned
        self._send(replanned.orders, lambda: on_replanned(replanned))

    def deliver(self, count: int | None = None) -> None:
        """The first `count` answers in transit (all when None) reach their callbacks."""
        count = len(self.in_transit) if count is None else count
        arrived, self.in_transit = self.in_transit[:count], self.in_transit[count:]
        for _, arrive in arrived:
            arrive()

    def overtake(self, index: int) -> None:
        """The answer at `index` in transit arrives now, ahead of the ones before it (two
        replies of one actor, or a reply and Orders sent unasked, may cross)."""
        _, arrive = self.in_transit.pop(index)
        arrive()

    def _answer(self, orders: Orders, on_orders) -> None:
        self.last = orders
        self._send(orders, lambda: on_orders(orders))

    def _send(self, orders: Orders, arrive: Callable[[], None]) -> None:
        if self.hold or self.in_transit:
            self.in_transit.append((orders, arrive))
        else:
            arrive()


class Driver:
    """Runs requests through a CacheManager and a FakeModelActor, checking both after every call."""

    def __init__(
        self, config: CacheConfig | None = None, state_layers: bool = True, **knobs
    ) -> None:
        config = config or CacheConfig(**knobs)
        # The disk tier stays off here (it would open the user's cache directory);
        # DiskDriver turns it on in a directory of its own.
        manager = CacheManager(config, fingerprint="fake", has_state_layers=state_layers)
        self._start(manager, FakeModelActor(state_layers=state_layers))

    def _start(self, manager: CacheManager, actor: FakeModelActor) -> None:
        self.manager = manager
        self.actor = actor
        actor.shared_rows_min = manager.config.shared_rows_min  # the model actor's setting
        self.link = HeldLink(manager)
        self.ledger = OrderLedger(self.link)  # the model actor's own ordering rule
        self._requests: dict[str, tuple[RestorePlan, np.ndarray, str]] = {}
        self._restored: set[str] = set()
        self._early: dict[str, set[int]] = {}  # anchors committed mid-prefill, by request
        self._serial = 0
        # request id -> seq of the Orders making its room (None: asked, not answered)
        self._rooms: dict[str, int | None] = {}

    @property
    def hold(self) -> bool:
        """Whether the manager's answers queue up until `deliver()` (see the module doc)."""
        return self.link.hold

    @hold.setter
    def hold(self, value: bool) -> None:
        self.link.hold = value

    @property
    def in_transit(self) -> list[Orders]:
        """The Orders answered and not delivered yet, in order."""
        return [orders for orders, _ in self.link.in_transit]

    def plan(
        self,
        prompt,
        anchor_len: int = 0,
        namespace: str = "",
        request_id: str | None = None,
        layout: PromptLayout | None = None,
    ) -> RestorePlan:
        """Plan `prompt`; `layout`: where its messages start (PlanRequest.layout)."""
        if request_id is None:
            self._serial += 1
            request_id = f"r{self._serial}"
        prompt = tokens(prompt)
        layout = layout or PromptLayout()
        plan = self.manager.plan(
            PlanRequest(request_id, prompt, anchor_len, namespace, layout=layout)
        )
        self._requests[request_id] = (plan, prompt, namespace)
        self.check()
        return plan

    def lose(self, request_id: str, load_failed: bool = False) -> RestorePlan:
        """The actor finds the plan's restore point gone at admission: it asks for a new plan
        (known here at once; its Orders may travel late)."""
        plan, prompt, namespace = self._requests[request_id]
        lost = LostRestore(request_id, plan.entry_id, plan.length, load_failed)
        self.ledger.replan(lost, lambda replanned: self.actor.apply(replanned.orders))
        replanned = self.link.last
        self._rooms.pop(request_id, None)  # the new plan asks for its own
        self._requests[request_id] = (replanned.plan, prompt, namespace)
        self.check()
        return replanned.plan

    def planned(self, request_id: str) -> RestorePlan:
        """The plan of a request not yet committed or released."""
        return self._requests[request_id][0]

    def _entering(self, key: str | None) -> Callable[[Orders], None]:
        """The callback of a commit's answer: the entries staged under `key` enter the
        actor, then the Orders apply."""

        def arrived(orders: Orders) -> None:
            self.actor.enter(key)
            self.actor.apply(orders)

        return arrived

    def deliver(self, count: int | None = None) -> None:
        """The first `count` Orders in transit (all when None) reach the actor, in order."""
        self.link.deliver(count)
        self.check()

    def room(self, request_id: str) -> bool:
        """A plan about to load a file asks for the Orders that make room for its entry
        (once); whether they are applied."""
        if request_id not in self._rooms:
            self._rooms[request_id] = None

            def made(orders: Orders) -> None:
                self.actor.apply(orders)
                if request_id in self._rooms:
                    self._rooms[request_id] = orders.seq

            self.ledger.room(request_id, made)
        seq = self._rooms[request_id]
        return seq is not None and not self.ledger.behind(seq)

    def ready(self, plan: RestorePlan) -> bool:
        """Whether the actor may restore `plan`: no Orders before it can still be on their way."""
        return not self.ledger.behind(plan.after_orders)

    def restore(self, request_id: str) -> bool:
        """The model actor takes the restore point (it may do so long after the plan).

        False while it must wait: for Orders still in transit, or for the anchor
        it waits on.
        """
        plan, prompt, _ = self._requests[request_id]
        if not self.ready(plan):
            return False  # Orders decided before the plan are still on their way
        if plan.wait and plan.entry_id not in self.actor.stored:
            return False  # the actor holds the request until the anchor it waits on is stored
        self.actor.restore(plan, prompt)
        self._restored.add(request_id)
        return True

    def capture_anchor(self, request_id: str) -> Orders | None:
        """The request's prefill reaches its anchor: stored and committed at once (AnchorCommit)."""
        plan, prompt, namespace = self._requests[request_id]
        early = self._early.setdefault(request_id, set())
        point = next(
            (p for p in plan.captures if p.kind == "anchor" and p.entry_id not in early), None
        )
        if point is None:
            return None
        key = f"{request_id}#{point.entry_id}"
        self.actor.store_capture(point.entry_id, prompt, point.length, key)
        anchor = AnchorCommit(
            request_id,
            namespace,
            point.entry_id,
            prompt[: point.length],
            KVPT,
            STATE if self.actor.state_layers else 0,
        )
        self.ledger.commit_anchor(anchor, self._entering(key))
        early.add(point.entry_id)
        self.check()
        return self.link.last

    def commit(
        self,
        request_id: str,
        reply=(),
        taken: int | None = None,
        cold: bool = False,
        upto: int | None = None,
    ) -> Orders:
        """Restore (if not yet), prefill, decode `reply`, commit, apply the orders.

        `cold`: the actor found the restore point gone and prefilled from scratch.
        `upto`: cancelled in prefill after that many tokens (see FakeModelActor.prefill).
        """
        plan = self._requests[request_id][0]
        if request_id not in self._restored and not self.ready(plan):
            self.deliver()  # the actor waits for them before it restores
        if plan.wait and plan.entry_id not in self.actor.stored:
            cold = True  # the anchor it waited on was never captured
        if request_id not in self._restored and not cold:
            self.restore(request_id)
        plan, prompt, namespace = self._requests.pop(request_id)
        self._restored.discard(request_id)
        self._rooms.pop(request_id, None)
        early = self._early.pop(request_id, set())
        stored_early = [(p.length, p.entry_id) for p in plan.captures if p.entry_id in early]
        anchor = max(stored_early, default=None)
        plan = replace(plan, captures=tuple(p for p in plan.captures if p.entry_id not in early))
        if cold:
            plan = replace(plan, entry_id=None, length=0, kind="none")
        anchor = (anchor[1], anchor[0]) if anchor is not None else None
        commit = self.actor.prefill(plan, prompt, tokens(reply), taken, upto, anchor)
        if commit is None:
            commit = _off_commit(plan, prompt, namespace)
        self.ledger.commit(replace(commit, namespace=namespace), self._entering(request_id))
        self.check()
        return self.link.last

    def release(self, request_id: str, taken: int = 0) -> Orders:
        """Cancel a request after its prefill took `taken` capture points; release its stores."""
        if taken and request_id not in self._restored:
            if not self.ready(self._requests[request_id][0]):
                self.deliver()
            self.restore(request_id)
        plan, prompt, _ = self._requests.pop(request_id)
        self._restored.discard(request_id)
        self._rooms.pop(request_id, None)
        early = self._early.pop(request_id, set())
        stored = []
        for point in [p for p in plan.captures if p.entry_id not in early][:taken]:
            if point.entry_id is not None:
                self.actor.store_capture(point.entry_id, prompt, point.length, request_id)
                stored.append(point.entry_id)
        self.ledger.release(Release(request_id, tuple(stored)), self._entering(request_id))
        self.check()
        return self.link.last

    def turn(self, prompt, reply=(), anchor_len: int = 0, namespace: str = "", layout=None):
        """One whole request: plan, restore, prefill, commit. Returns (plan, orders)."""
        plan = self.plan(prompt, anchor_len, namespace, layout=layout)
        return plan, self.commit(plan.request_id, reply)

    def entry(self, entry_id: int):
        return self.manager.index.get(entry_id)

    def checkpoints(self, entry_id: int) -> dict[int, str]:
        """Length -> kind of an indexed entry's checkpoints."""
        return {n: c.kind for n, c in sorted(self.entry(entry_id).checkpoints.items())}

    def check(self) -> None:
        """The manager's invariants, the actor within the RAM budget (always), and holding
        exactly the index plus deferred frees (once every Orders in transit is delivered)."""
        self.manager.check_invariants()
        self.check_budget()
        if self.link.in_transit:
            return
        index = self.manager.index
        for entry in index.entries():
            held = self.actor.stored.get(entry.id)
            assert held is not None, f"indexed entry {entry.id} is not held by the actor"
            assert np.array_equal(held.tokens, entry.tokens)
            assert held.states == set(entry.checkpoints) | {entry.length}, (entry.id, held.states)
            if entry.logits_at is not None:
                assert entry.logits_at in held.logits, (entry.id, entry.logits_at)
            assert self.actor.bytes_of(entry.id) == entry.nbytes, (entry.id, "bytes differ")
        expected = {e.id for e in index.entries()} | set(index.deferred)
        assert set(self.actor.stored) == expected, (sorted(self.actor.stored), sorted(expected))

    def check_budget(self) -> None:
        """What the actor holds never exceeds the RAM budget, Orders in transit or not."""
        budget = self.manager.config.ram_budget
        assert self.actor.nbytes <= budget, (self.actor.nbytes, budget)


def _off_commit(plan: RestorePlan, prompt: np.ndarray, namespace: str) -> Commit:
    """What an actor would send when the cache is off (the manager ignores it)."""
    return Commit(plan.request_id, namespace, 0, prompt, len(prompt), None, 0, (), KVPT, STATE)


# -- the disk tier ---------------------------------------------------------------


def write_fake_file(directory, record, fingerprint: str = "fake", body_bytes: int = 64) -> None:
    """A real entry file (engine.storage.file_format, header and checksums) with a dummy body.

    Enough for the scan and the policy (headers only); not loadable into MLX.
    """

    meta = {
        "fingerprint": fingerprint,
        "entry_id": record.entry_id,
        "namespace": record.namespace,
        "role": record.role,
        "length": len(record.tokens),
        "prompt_len": record.prompt_len,
        "checkpoints": [list(c) for c in record.checkpoints],
        "kv_bytes_per_token": record.kv_bytes_per_token,
        "state_bytes": record.state_bytes,
        "created": 0.0,
        "layers": [],
        "states": [],
    }
    body = np.full(body_bytes, record.entry_id % 251, dtype=np.uint8)
    job = writer.WriteJob(
        record.entry_id, meta, np.asarray(record.tokens, np.int32), [body], ["uint8"]
    )
    writer.write_file(directory, job)


@dataclass
class FakeDiskActor(FakeModelActor):
    """A FakeModelActor that also writes, deletes and loads entry files (real headers).

    Like the real disk writer it keeps its operations in order behind a queue
    that `paused` holds back until `flush()`: a delete drops a write not
    started yet, and a load reads a queued write from the queue (only this
    writer's own reader sees it), never from the directory.
    """

    directory: object = None  # the entries directory
    fingerprint: str = "fake"
    loads: int = 0
    paused: bool = False
    queue: list = field(default_factory=list)  # ("write", EntryRecord) | ("delete", id)
    written: list = field(default_factory=list)  # (id, bytes) written since take_written()

    def load(self, plan: RestorePlan) -> bool:
        """Read a plan's restore source (`read`) and store it, unless the entry held serves
        the plan (as RamTier.prepare); False when the file is missing or damaged."""

        if self.serves(plan):
            return True
        entry = self.read(plan.entry_id)
        if entry is None:
            return False
        self.stored[plan.entry_id] = entry
        return True

    def read(self, entry_id: int) -> Stored | None:
        """An entry from its queued write or its file, not kept (None: missing or damaged)."""
        queued = self._queued(entry_id)
        if queued is not None:
            found, length, points = queued.tokens, len(queued.tokens), queued.checkpoints
        else:
            try:
                header = file_format.read_header(file_format.entry_path(self.directory, entry_id))
            except (FileNotFoundError, file_format.DamagedFile):
                return None
            assert header.fingerprint == self.fingerprint and header.entry_id == entry_id
            found, length, points = header.tokens, header.length, header.checkpoints
        self.loads += 1
        return Stored(np.array(found), {n for n, _ in points} | {length})

    def serves(self, plan: RestorePlan) -> bool:
        """Whether the entry held serves the plan's restore (no file read needed)."""
        held = self.stored.get(plan.entry_id)
        return held is not None and (plan.length in held.states or not self.state_layers)

    def apply(self, orders: Orders) -> None:
        """Moves and drops, then deletes, writes (the entry as it is now) and frees, in
        RamTier.apply's order."""

        super().apply(Orders(moves=orders.moves, drop_checkpoints=orders.drop_checkpoints))
        for entry_id in orders.delete_files:
            dropped = self._queued(entry_id)
            if dropped is None:
                self.queue.append(("delete", entry_id))
                continue
            # Not started: dropped, with the files it was to replace (as the real writer).
            self.queue = [op for op in self.queue if op[1] is not dropped]
            self.queue += [("delete", old) for old in dropped.supersedes]
        assert tuple(r.entry_id for r in orders.records) == orders.write
        for record in orders.records:
            held = self.stored.get(record.entry_id)
            assert held is not None, f"write of entry {record.entry_id}, which is not held"
            assert np.array_equal(held.tokens, record.tokens), record.entry_id
            lengths = {n for n, _ in record.checkpoints} | {len(record.tokens)}
            assert held.states == lengths, (record.entry_id, held.states, lengths)
            self.queue.append(("write", record))
        super().apply(Orders(rejoin=orders.rejoin, free=orders.free))
        if not self.paused:
            self.flush()

    def flush(self) -> list[int]:
        """Carry out the queued writes and deletes in order; the ids written."""
        done, self.queue = self.queue, []
        for op, item in done:
            if op == "delete":
                delete_files(self.directory, item)
                continue
            write_fake_file(self.directory, item, self.fingerprint)
            for superseded in item.supersedes:  # after the successor's file is durable
                delete_files(self.directory, superseded)
            path = file_format.entry_path(self.directory, item.entry_id)
            self.written.append((item.entry_id, path.stat().st_size))
        return [item.entry_id for op, item in done if op == "write"]

    def take_written(self) -> list[tuple[int, int]]:
        """(id, bytes) written since the last call (what the real writer reports durable)."""
        written, self.written = self.written, []
        return written

    def _queued(self, entry_id: int):
        return next((r for op, r in self.queue if op == "write" and r.entry_id == entry_id), None)

    def files(self, damaged: bool = False) -> set[int]:
        """Ids of the sound files of this fingerprint (or, `damaged`, of the damaged ones)."""

        scanned = scan_directory(self.directory, remove_temps=False).files
        if damaged:
            return {f.entry_id for f in scanned if f.problem is not None}
        return {
            f.entry_id
            for f in scanned
            if f.header is not None and f.header.fingerprint == self.fingerprint
        }


class DiskDriver(Driver):
    """A Driver with the disk tier on, in `directory` (its own cache_dir)."""

    def __init__(
        self,
        directory,
        config: CacheConfig | None = None,
        state_layers: bool = True,
        fingerprint: str = "fake",
        **knobs,
    ) -> None:

        config = replace(config or CacheConfig(**knobs), cache_dir=str(directory))
        self.opened = open_cache_directory(config, fingerprint)
        manager = CacheManager(
            config,
            fingerprint=fingerprint,
            has_state_layers=state_layers,
            disk_index=self.opened.index if self.opened else None,
        )
        assert manager.disk_index is not None, "the disk tier did not open"
        actor = FakeDiskActor(
            state_layers=state_layers,
            directory=file_format.entries_dir(directory, config.mode),
            fingerprint=fingerprint,
        )
        self._start(manager, actor)

    def restore(self, request_id: str) -> bool:
        plan = self._requests[request_id][0]
        if not self.ready(plan):
            return False
        if plan.load_from_disk and not self.actor.serves(plan):
            if not self.room(request_id):
                return False  # the Orders making room for the file's entry are on their way
            assert self.actor.load(plan), f"file of entry {plan.entry_id} did not load"
        return super().restore(request_id)

    def commit(self, request_id: str, reply=(), taken=None, cold: bool = False, upto=None):
        """As Driver.commit; a restore whose file fails falls back to cold (as the actor)."""
        plan = self._requests[request_id][0]
        if request_id not in self._restored and not self.ready(plan):
            self.deliver()
        if plan.load_from_disk and request_id not in self._restored and not cold:
            if not self.actor.serves(plan) and not self.room(request_id):
                self.deliver()  # the actor waits for its room's Orders
            cold = not self.actor.load(plan)
        return super().commit(request_id, reply, taken, cold, upto)

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()

    def check(self) -> None:
        """The manager's invariants; the actor holds the index, deferred and pending frees; the
        files of this fingerprint are the disk index's entries."""
        self.manager.check_invariants()
        self.check_budget()
        if self.link.in_transit:
            return
        index = self.manager.index
        loading = set(self.manager.unread)  # the actor may not have read these files yet
        for entry in index.entries():
            held = self.actor.stored.get(entry.id)
            if held is None and entry.id in loading:
                continue
            assert held is not None, f"indexed entry {entry.id} is not held by the actor"
            assert held.states == set(entry.checkpoints) | {entry.length}, (entry.id, held.states)
            assert self.actor.bytes_of(entry.id) == entry.nbytes, (entry.id, "bytes differ")
        pending = self.manager.pending_orders
        expected = ({e.id for e in index.entries()} | set(index.deferred)) - loading
        assert expected <= set(self.actor.stored) <= expected | loading | set(pending.free)
        if self.actor.queue:
            return  # the writer holds writes back: the disk is behind the index
        disk_index = self.manager.disk_index
        own = {i for i, f in disk_index.files.items() if f.entry is not None} - set(pending.write)
        own -= self.actor.files(damaged=True)  # damaged since the scan: found at a load
        assert self.actor.files() == own, (sorted(self.actor.files()), sorted(own))
