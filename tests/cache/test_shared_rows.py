"""Prefix rows stored once, as the cache policy counts them (the fake actor, no MLX).

Sub-agents on one system prompt restore its anchor and hold only the rows after it;
the manager counts the anchor's rows once, evicts readers before the entry they read
from, frees a reader's own rows only, and when an entry others read from leaves
anyway (an anchor's cap), orders its readers to take the rows (a rejoin). A sibling
branch reads a conversation that stays; an absorbed source shares nothing. The fake
actor holds rows by the model actor's rule and the driver checks, after every
call, that it holds what the index counts.
"""

from __future__ import annotations

from engine.cache.kinds import Role
from engine.cache.messages import Orders
from tests.fakes import KVPT, STATE, Driver, entry_bytes, tokens

SYSTEM = 2000


def seq(start: int, n: int) -> range:
    return range(start, start + n)


def sub_agent(d: Driver, k: int, **kw):
    """Sub-agent k on the shared system prompt: one 200-token user message, 20 replied."""
    prompt = tokens(seq(1, SYSTEM), seq(100_000 * (k + 1), 200))
    return d.turn(prompt, seq(50_000 + 100 * k, 20), anchor_len=SYSTEM, **kw)


def test_sub_agents_hold_the_anchors_rows_once():
    d = Driver()
    ids = [sub_agent(d, k)[0].new_entry_id for k in range(4)]
    (anchor,) = d.manager.index.entries(Role.ANCHOR)
    for entry_id in ids:
        entry = d.entry(entry_id)
        assert (entry.prefix_id, entry.prefix_len) == (anchor.id, SYSTEM)
        # Its own rows (the message and the reply) and its states, not the anchor's rows.
        assert entry.nbytes == entry_bytes(220, len(entry.checkpoints))
    held = d.manager.stats().ram_bytes
    assert held == anchor.nbytes + sum(d.entry(i).nbytes for i in ids)
    assert d.manager.index.shared_bytes() == 4 * SYSTEM * KVPT
    # Stored whole, the same traffic holds a copy of the anchor's rows per sub-agent.
    whole = Driver(shared_rows_min=1 << 30)
    for k in range(4):
        sub_agent(whole, k)
    assert whole.manager.stats().ram_bytes - held == 4 * SYSTEM * KVPT


def test_evicting_a_sub_agent_frees_only_its_own_rows():
    probe = Driver()
    for k in range(3):
        sub_agent(probe, k)
    budget = probe.manager.stats().ram_bytes
    d = Driver(ram_budget=budget)
    ids = [sub_agent(d, k)[0].new_entry_id for k in range(3)]
    before = d.actor.nbytes
    own = d.actor.bytes_of(ids[0])
    _, orders = sub_agent(d, 3)  # one more: the least recently used reader goes
    assert orders.free == (ids[0],) and not orders.rejoin
    assert own < (SYSTEM + 220) * KVPT  # the anchor's rows were not its own
    assert d.actor.nbytes == before - own + d.actor.bytes_of(d.manager.index.entries()[-1].id)
    (anchor,) = d.manager.index.entries(Role.ANCHOR)
    assert all(d.entry(i).prefix_id == anchor.id for i in ids[1:])


def test_the_anchor_goes_after_its_readers():
    """An entry others read from is not evicted while they are indexed: the readers go
    first, the anchor once it has none (or alone overflows)."""
    anchor_bytes = entry_bytes(SYSTEM)
    reader = entry_bytes(220, 1)
    d = Driver(ram_budget=anchor_bytes + 2 * reader)
    ids = [sub_agent(d, k)[0].new_entry_id for k in range(4)]
    anchors = d.manager.index.entries(Role.ANCHOR)
    assert len(anchors) == 1 and d.manager.index.has_dependents(anchors[0].id)
    assert [d.entry(i) is not None for i in ids] == [False, False, True, True]


def test_an_anchor_over_its_cap_makes_its_readers_take_its_rows():
    d = Driver(anchor_max_entries=1)
    ids = [sub_agent(d, k)[0].new_entry_id for k in range(2)]
    (first,) = d.manager.index.entries(Role.ANCHOR)
    # A sub-agent of another system prompt: its anchor takes the only anchor slot.
    prompt = tokens(seq(700_000, SYSTEM), seq(900_000, 200))
    _, orders = d.turn(prompt, seq(7, 20), anchor_len=SYSTEM)
    assert first.id in orders.free and set(orders.rejoin) == set(ids)
    for entry_id in ids:
        entry = d.entry(entry_id)
        assert entry.prefix_id is None
        assert entry.nbytes == entry_bytes(SYSTEM + 220, len(entry.checkpoints))


def test_a_sibling_branch_reads_the_conversation_that_stays():
    d = Driver()
    system, user = seq(1, 500), seq(20_000, 600)
    first, _ = d.turn(tokens(system, user), seq(30_000, 20))
    # A branch that edits the end of the last message restores at the first entry's
    # guard point (before its prompt end): the first entry stays, the branch reads it.
    edited = tokens(system, seq(20_000, 590), seq(60_000, 50))
    branch, _ = d.turn(edited, seq(31_000, 20))
    assert branch.entry_id == first.new_entry_id and branch.kind == "guard"
    assert branch.shares == (first.new_entry_id, branch.length)
    entry = d.entry(branch.new_entry_id)
    assert (entry.prefix_id, entry.prefix_len) == (first.new_entry_id, branch.length)
    # The first conversation's next turn restores at its prompt end and absorbs it: the
    # branch takes the rows it read.
    _, orders = d.turn(tokens(system, user, seq(30_000, 20), seq(40_000, 30)), seq(32_000, 5))
    assert first.new_entry_id in orders.free and orders.rejoin == (branch.new_entry_id,)
    assert d.entry(branch.new_entry_id).prefix_id is None


def test_a_conversations_next_turn_reads_the_anchor_its_source_read():
    d = Driver()
    first, _ = sub_agent(d, 0)
    (anchor,) = d.manager.index.entries(Role.ANCHOR)
    prompt = tokens(seq(1, SYSTEM), seq(100_000, 200), seq(50_000, 20), seq(70_000, 40))
    turn, orders = d.turn(prompt, seq(7, 5), anchor_len=SYSTEM)
    assert turn.entry_id == first.new_entry_id and first.new_entry_id in orders.free
    assert turn.shares == (anchor.id, SYSTEM)  # its source is absorbed; the anchor stays
    entry = d.entry(turn.new_entry_id)
    assert (entry.prefix_id, entry.prefix_len) == (anchor.id, SYSTEM)


def test_an_absorbed_source_shares_nothing():
    d = Driver()
    plan, _ = d.turn(tokens(seq(1, 500), seq(20_000, 600)), seq(30_000, 20))
    follow, orders = d.turn(
        tokens(seq(1, 500), seq(20_000, 600), seq(30_000, 20), seq(40_000, 30)), seq(7, 5)
    )
    assert follow.entry_id == plan.new_entry_id and follow.shares is None
    assert plan.new_entry_id in orders.free
    assert d.entry(follow.new_entry_id).prefix_id is None
    assert d.entry(follow.new_entry_id).nbytes >= 1150 * KVPT + STATE
    assert orders == Orders(
        moves=orders.moves, drop_checkpoints=orders.drop_checkpoints, free=orders.free
    )


def test_sub_agents_arriving_together_read_the_anchor_one_of_them_captures():
    d = Driver()
    a = d.plan(tokens(seq(1, SYSTEM), seq(100_000, 200)), anchor_len=SYSTEM)
    b = d.plan(tokens(seq(1, SYSTEM), seq(200_000, 200)), anchor_len=SYSTEM)
    anchor_id = a.captures[0].entry_id
    assert b.wait and b.shares == (anchor_id, SYSTEM)
    d.capture_anchor(a.request_id)
    d.commit(b.request_id, seq(7, 20))
    d.commit(a.request_id, seq(8, 20))
    for plan in (a, b):
        entry = d.entry(plan.new_entry_id)
        assert (entry.prefix_id, entry.prefix_len) == (anchor_id, SYSTEM)


def test_a_sub_agents_file_counts_every_row(tmp_path):
    """The disk tier's files hold every row (the anchor's too): its budget counts them."""
    from tests.fakes import DiskDriver

    d = DiskDriver(tmp_path)
    try:
        ids = [sub_agent(d, k)[0].new_entry_id for k in range(2)]
        for entry_id in ids:
            entry = d.entry(entry_id)
            assert entry.prefix_id is not None
            on_disk = d.manager.disk_index.files[entry_id].nbytes
            assert on_disk >= entry.length * KVPT > entry.nbytes - STATE * 4
    finally:
        d.close()
