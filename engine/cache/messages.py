"""Messages between the front end, the cache manager and the model actor.

Frozen dataclasses only; plain Python plus numpy (no MLX, no Ray), so the
cache policy and its tests import this module freely.

The flow (docs/architecture.md, "One request's path"):

    front end   --PlanRequest-->  cache manager  --RestorePlan-->  front end
    front end   --(plan, sampling)-->  model actor
    model actor --Commit-->  cache manager  --Orders-->  model actor
    model actor --Release-->  cache manager  --Orders-->  model actor  (cancel / error)

The model actor stores tensors keyed by entry id and obeys Orders; it never
decides what to keep.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from engine.cache.kinds import CaptureKind, CheckpointKind, MissKind, RestoreKind, Role


@dataclass(frozen=True)
class PromptLayout:
    """A chat prompt's messages as the cache sees them (engine.server.prompts.layout builds it):
    where each starts in the tokens, a digest of each, their roles, a digest of the
    tools. Empty for a prompt of raw tokens or text."""

    starts: tuple[int, ...] = ()  # token index where message k starts, ascending
    digests: tuple[str, ...] = ()  # per message: a hash of the message as sent
    roles: tuple[str, ...] = ()
    tools: str = ""  # a hash of the tools list; "" when none
    # Messages the client marked as places it comes back to (Anthropic's cache_control)
    marks: tuple[int, ...] = ()

    @property
    def head(self) -> int:
        """How many messages lead as system messages."""
        n = 0
        while n < len(self.roles) and self.roles[n] == "system":
            n += 1
        return n

    def spans(self, size: int) -> tuple[tuple[int, int], ...]:
        """Token spans (start, end) of the messages after the leading system messages, in a
        prompt of `size` tokens: each ends where the next starts, the last at `size` (its
        generation prompt included); empty spans left out."""
        bounds = self.starts[self.head :] + (size,)
        return tuple((a, b) for a, b in zip(bounds, bounds[1:]) if a < b)

    def marked(self, size: int) -> tuple[int, ...]:
        """Where each marked message ends in a prompt of `size` tokens (where the next
        starts; the last message's end is the prompt's), ascending."""
        ends = self.starts[1:] + (size,)
        return tuple(sorted({ends[k] for k in self.marks if 0 <= k < len(ends)}))

    def message_at(self, token: int) -> int:
        """The message whose tokens hold `token`; -1 before the first (the template's
        header and, where it renders them first, the tools); -1 without starts."""
        return bisect.bisect_right(self.starts, token) - 1


@dataclass(frozen=True)
class PlanRequest:
    """A prompt the front end wants to run."""

    request_id: str
    tokens: np.ndarray  # int32 prompt token ids
    anchor_len: int = 0  # tokens shared with the (system + tools) render; 0: none
    namespace: str = ""
    # Replicas this request must not run on (a retry after its replica died).
    exclude: tuple[int, ...] = ()
    # The conversation's session key (x-session-id, prompt_cache_key, ...): its turns go
    # to the replica that served it last, load permitting. Scoped by the namespace.
    session: str = ""
    # Where each message starts (the miss explanations; the long-message points inside
    # each message after the system block, engine.cache.message_points).
    layout: PromptLayout = field(default_factory=PromptLayout)
    # The caller honours RestorePlan.after: it may be told to wait for a request in flight
    # and asks again (with False once its wait bound is spent: then it is planned at once).
    may_wait: bool = False


@dataclass(frozen=True)
class Miss:
    """Why a prompt restored less than an earlier prompt of its namespace offered.

    `token`: where it stopped matching that prompt (EVICTED: how far it matched, the
    cache no longer holding it); `message`: the message of this prompt holding that
    token (-1: before the first message, in the template's header or tools);
    `earlier`: that earlier prompt's length (with its reply, where the cache stored it).
    """

    kind: MissKind
    token: int
    message: int
    earlier: int

    def __str__(self) -> str:
        where = f"m{self.message}" if self.message >= 0 else "head"
        return f"{self.kind}@{self.token}/{where}"


@dataclass(frozen=True)
class CapturePoint:
    """Stop prefill at `length` tokens and snapshot the state layers there.

    With `entry_id` set, the capture becomes a separate entry of its own (an
    anchor, or exact mode's prompt-minus-16 snapshot): the rows [:length] of the
    append-only layers plus the state at `length`, stored under that id.
    Without it, the capture is a checkpoint of the request's new entry.
    """

    length: int
    kind: CaptureKind
    entry_id: int | None = None


@dataclass(frozen=True)
class RestorePlan:
    """The manager's answer to a PlanRequest."""

    request_id: str
    entry_id: int | None  # stored entry to restore from; None: cold
    # restored tokens (0 when cold); the rows/state to take. The whole prompt
    # only at a prompt end that kept its log-probabilities (a verbatim resend):
    # the actor samples the first token from them, with no forward.
    length: int
    kind: RestoreKind
    captures: tuple[CapturePoint, ...] = ()  # ascending, all > length, all < len(prompt)
    new_entry_id: int | None = (
        None  # where the model actor stores this request; None: store nothing
    )
    store_reply: bool = (
        True  # entry extends over the reply (lineage); False: ends at the prompt (exact)
    )
    # The restore source is on the disk tier only: the model actor reads its file
    # into RAM on its reader thread while the request waits (RamTier.start_load),
    # and finishes the load at admission (RamTier.prepare), before restoring.
    load_from_disk: bool = False
    # The restore source is an anchor that another in-flight request is about to
    # capture (parallel sub-agents sharing a system prompt, arriving together):
    # the model actor admits this request once it holds that entry, and prefills
    # cold if the capture never happens. The shared prefix is paid once.
    wait: bool = False
    # The model replica that runs the request (engine.cache.replicas routes it).
    replica: int = 0
    # The replica holding the restore source when `replica` does not: the
    # running replica fetches the entry's arrays from it before admission
    # (a handover through Ray's object store), and prefills cold if it cannot.
    fetch_from: int | None = None
    # The `seq` of the last Orders the manager handed out before this plan. The
    # plan reaches the model actor by another path than those Orders (the front
    # end, not the manager's reply), so the actor restores only once it applied
    # every Orders up to this one: a free, move or write decided before the plan
    # is never applied after the restore it would change.
    after_orders: int = 0
    # (entry id, length): the new entry may read its first `length` rows from that
    # entry (Commit.prefix) instead of holding a copy: the restore source when it
    # outlives the commit, else the entry the source reads its own first rows from
    # (engine.cache.shared_rows). None: nothing to read.
    shares: tuple[int, int] | None = None
    # Why this prompt restores less than an earlier one of its namespace offered (None:
    # it does not, or it starts a conversation of its own): logged, shown by `lineage top`.
    miss: Miss | None = None
    # The epoch of `replica` when the manager placed the plan there (the manager
    # actor stamps it): a replica resynchronised since (reset, its RAM tier
    # emptied) refuses the plan, and so does one that has not caught up with it.
    epoch: int = 0
    # Not a plan but "ask again later": the request in flight (its id) whose capture
    # would restore this prompt much further than anything stored (a long prefix they
    # share, still being prefilled). Nothing was allocated or pinned; the caller plans
    # again once that request committed or ended (PlanRequest.may_wait). "": a plan.
    after: str = ""
    # With `after`, when this prompt extends that request's prompt whole: the id under which
    # that request stores its prompt end as soon as it has it, before its decode ends (the
    # caller asks its replica, `replica`: PromptEndCommit). None: wait for its commit.
    after_entry: int | None = None


@dataclass(frozen=True)
class CapturedPoint:
    """A capture the model actor actually took (prefill may be cut short)."""

    length: int
    kind: CaptureKind
    entry_id: int | None = None


@dataclass(frozen=True)
class Commit:
    """A finished request's cache, now held by the model actor under `entry_id`.

    `tokens` are the tokens the stored entry covers: the prompt plus the reply
    when the plan said store_reply, else the prompt. The stored entry holds the
    state at len(tokens) and, as a checkpoint, the state at `prompt_len` (the
    prompt end) when store_reply and the reply is non-empty. `captures` lists
    the capture points taken (checkpoints and separate entries).
    """

    request_id: str
    namespace: str
    entry_id: int
    tokens: np.ndarray  # int32
    prompt_len: int
    restored_from: int | None  # echo of the plan
    restored_length: int
    captures: tuple[CapturedPoint, ...]
    kv_bytes_per_token: int  # bytes of one token's rows across all append-only layers
    state_bytes: int  # bytes of one state snapshot (all state layers)
    # The actor kept what the sampler needs at the prompt end (the last position's
    # log-probabilities): a resend of exactly this prompt restores at its end and
    # prefills nothing. None: not kept (cut short, exact mode).
    logits_at: int | None = None
    logits_bytes: int = 0
    # (entry id, length): the stored entry reads its first `length` rows from that
    # entry (the anchor its prefill captured, or the restore source that stays) and
    # holds the rest; None: it holds every row (engine.cache.shared_rows).
    prefix: tuple[int, int] | None = None


@dataclass(frozen=True)
class AnchorCommit:
    """An anchor captured mid-prefill and stored by the model actor at once.

    Indexed before the capturing request ends, so requests waiting on the same
    system prompt (RestorePlan.wait) restore it; the request's later Commit
    does not list it again.
    """

    request_id: str
    namespace: str
    entry_id: int
    tokens: np.ndarray  # int32, the anchor's tokens
    kv_bytes_per_token: int
    state_bytes: int


@dataclass(frozen=True)
class PromptEndCommit(AnchorCommit):
    """A request's prompt end stored by the model actor while the request still decodes,
    because another request waits for it (RestorePlan.after_entry): the prompt's rows, the
    state and the log-probabilities at its end, under `entry_id`.

    Sent and answered as an AnchorCommit is (the same call); indexed as a conversation
    entry ending at the prompt, which the request's own Commit later supersedes (its entry
    holds the same prompt end): the early entry is freed then, once no plan pins it.
    """

    logits_at: int | None = None  # the prompt's length: its log-probabilities are kept
    logits_bytes: int = 0


@dataclass(frozen=True)
class LostRestore:
    """The model actor found a plan's restore point gone at admission (it holds no such
    entry or no state at that length, or the entry's file would not load).

    The manager forgets the entry in RAM (its file, if any and sound, stays on
    the disk tier) and answers a fresh plan for the same request.
    """

    request_id: str
    entry_id: int
    length: int
    load_failed: bool = False  # the plan said load_from_disk and the file would not load


@dataclass(frozen=True)
class Replanned:
    """The manager's answer to a LostRestore: the request's new plan, and Orders (the
    ids the old plan allocated are freed)."""

    plan: RestorePlan | None  # None: the request is not in flight any more
    orders: "Orders"


@dataclass(frozen=True)
class Release:
    """A planned request ended without a commit (cancelled, failed, cache off)."""

    request_id: str
    stored: tuple[int, ...] = ()  # entry ids the model actor stored anyway; the manager frees them


@dataclass(frozen=True)
class CheckpointMove:
    """Re-key the state snapshot at `length` from entry `src` to entry `dst`.

    Used by absorption: the old entry's checkpoints (and its prompt end or full
    length) become checkpoints of the new entry, reading their append-only rows
    from the new entry.
    """

    src: int
    length: int
    dst: int


# The layout of an entry file (engine.storage.file_format writes it in every
# file's prefix). The model fingerprint includes it, so files of another layout
# are another model's: counted, never matched.
ENTRY_FORMAT_VERSION = 1


@dataclass(frozen=True)
class EntryRecord:
    """The index's description of an entry, written into its disk file's header.

    The model actor holds the tensors; this says what they are: the tokens they
    cover, the prompt end, and the kind of each checkpoint (the state at every
    checkpoint length and at len(tokens) goes into the file).
    """

    entry_id: int
    namespace: str
    role: Role
    tokens: np.ndarray  # int32
    prompt_len: int
    checkpoints: tuple[tuple[int, CheckpointKind], ...]  # (length, kind), ascending
    kv_bytes_per_token: int
    state_bytes: int
    # Files this entry's file replaces (an absorbed source's): deleted once this
    # file is durable, and kept when the write fails or is dropped by a delete.
    supersedes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Orders:
    """What the model actor must do to its tiers. Applied in field order, except that
    the entries in `write` are captured (with their `records`) before `free`."""

    moves: tuple[CheckpointMove, ...] = ()
    drop_checkpoints: tuple[tuple[int, int], ...] = ()  # (entry_id, length)
    free: tuple[int, ...] = ()  # entry ids to drop from RAM
    # Entries that take every row into buffers of their own, before the frees: the
    # entry they read their first rows from leaves (or was never counted as theirs).
    rejoin: tuple[int, ...] = ()
    write: tuple[int, ...] = ()  # entry ids to write to the disk tier
    delete_files: tuple[int, ...] = ()  # entry ids whose disk files go
    # One record per id in `write`, same order: the file header. The actor
    # captures the entry for writing before it applies `free`, so an entry
    # spilled at its RAM eviction is written although it leaves RAM; the files
    # in `delete_files` go after the writes ordered before them.
    records: tuple[EntryRecord, ...] = ()
    # The manager numbers every Orders it hands out (1, 2, ...; 0: not numbered,
    # e.g. the cache is off); RestorePlan.after_orders refers to it. An envelope,
    # not content: two Orders that order the same things compare equal.
    seq: int = field(default=0, compare=False)

    def __bool__(self) -> bool:
        return bool(
            self.moves
            or self.drop_checkpoints
            or self.free
            or self.rejoin
            or self.write
            or self.delete_files
        )


@dataclass(frozen=True)
class CacheStats:
    """Counters for the CacheStats RPC."""

    mode: str
    entries: int
    anchors: int
    checkpoints: dict[str, int] = field(default_factory=dict)  # by kind
    ram_bytes: int = 0
    anchor_bytes: int = 0
    disk_bytes: int = 0
    disk_entries: int = 0
    hits: dict[str, int] = field(default_factory=dict)  # by restore kind
    evictions: int = 0
    disk_evictions: int = 0
    damaged_files: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    replicas: tuple[ReplicaStats, ...] = ()  # one per model replica
    # Planned restores the model actor could not do (the entry or its state was
    # gone, or its file would not load): each one is replanned, visible here and
    # in the request's log line, never a silent cold prefill.
    restores_lost: int = 0
    # File writes that never reached the disk (the writer's queue was full, or the
    # disk): the disk index forgot them.
    disk_writes_lost: int = 0
    misses: dict[str, int] = field(default_factory=dict)  # explained misses, by MissKind
    # The bytes of the files in the cache directory (read by the cache manager's actor),
    # against `disk_bytes`, what the disk budget holds: equal while no write is queued.
    disk_file_bytes: int = 0
    disk_free_bytes: int = 0  # free on the cache directory's filesystem (0: no disk tier)
    # Plans answered "wait for the request in flight" (RestorePlan.after): one per answer,
    # so a request that asks again before that request's prompt end is stored counts again.
    flight_waits: int = 0


@dataclass(frozen=True)
class ReplicaStats:
    """One model replica as the cache manager sees it (engine.cache.replicas)."""

    replica: int
    alive: bool
    entries: int  # indexed entries (anchors included) this replica holds in RAM
    ram_bytes: int
    queued_prefill_tokens: int  # prefill planned here and not started yet
    in_flight: int  # requests running here
    requests: int  # requests routed here
    restores: dict[str, int] = field(default_factory=dict)  # by restore kind
    handovers: int = 0  # restore sources fetched from a peer
    handover_bytes: int = 0
    sessions: int = 0  # session keys routed here last (none kept with one replica)
    session_moves: int = 0  # sessions moved off this replica because it was too busy


@dataclass(frozen=True)
class CacheAudit:
    """What the index counts, for a check against what the replicas hold and the disk has
    (`lineage bench faults`, tests): entries by id, where they are, and whether the
    manager's invariants hold."""

    ram: dict[int, int]  # indexed entry id -> bytes, deferred frees included
    holders: dict[int, tuple[int, ...]]  # entry id -> the replicas holding it
    disk: tuple[int, ...]  # ids of the files in the disk index (damaged and foreign too)
    machines: dict[int, str]  # file id -> its machine (its writer's, else the manager's)
    unread: tuple[int, ...]  # entries indexed from a file a replica may not have read yet
    in_flight: int  # requests planned and not committed or released
    violation: str = ""  # the failed invariant's message; "" when they all hold


@dataclass(frozen=True)
class AnchorUse:
    """One anchor as an operator sees it: its size and the conversations built on it."""

    entry_id: int
    namespace: str
    length: int
    nbytes: int
    sessions: int  # conversation entries of its namespace whose tokens extend it
