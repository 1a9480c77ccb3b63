"""`lineage bench agents`: the traffic generator, the oracle, and a small real run.

The traffic and oracle tests are plain Python; the run, at scale 0.05 with 2 agents,
drives each kind of policy once: the lineage engine on the session's Ray, mlx-lm's own
prompt cache in process and `mlx_lm.server`. The deep run (`LINEAGE_DEEP_TESTS=1`) adds
the exact and off engines, and holds lineage >= exact >= off in cached tokens (what
those modes cache is tested through the server in tests/server/test_cache_server.py).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re

import numpy as np
import pytest

from clients.bench import agents
from clients.bench.agents.observed import POLICIES, Observed, PolicyRun, oracle_lengths
from clients.bench.agents.report import summarize
from clients.bench.agents.traffic import Sessions, build_traffic
from clients.fanout import estimate_tokens
from tests.deep import deep

_WORD = re.compile(r"\w+|[^\w\s]")


# ----------------------------------------------------------------- traffic ----


def test_traffic_is_deterministic_for_a_seed():
    assert build_traffic(seed=3, scale=0.05, agents=2) == build_traffic(
        seed=3, scale=0.05, agents=2
    )
    assert build_traffic(seed=3, scale=0.05, agents=2) != build_traffic(
        seed=4, scale=0.05, agents=2
    )


@pytest.mark.parametrize("scale, agents", [(1.0, None), (0.05, 2)])
def test_traffic_holds_every_feature(scale, agents):
    t = build_traffic(seed=0, scale=scale, agents=agents)
    kinds = {r.kind for r in t.requests}
    assert {"first", "user", "tool_result", "edit", "regenerate", "retry"} <= kinds
    # K lanes in parallel: some step runs a request on every lane.
    assert max(len(step) for step in t.steps()) == t.agents
    # A dropped stream, retried verbatim by the same session right after.
    for dropped in (r for r in t.requests if r.drop_after):
        later = [r for r in t.requests if r.session == dropped.session and r.rid > dropped.rid]
        assert later[0].kind == "retry" and later[0].base == "same"
    assert any(r.drop_after for r in t.requests)
    # Tool calls on the replies, and tool results of varied size.
    results = [m for r in t.requests for m in r.new_messages if m["role"] == "tool"]
    assert all(r.reply_tool_calls for r in t.requests if r.kind == "tool_result")
    sizes = [estimate_tokens(m["content"]) for m in results]
    assert max(sizes) >= 4 * min(sizes)
    # A fresh session every few turns, on every lane.
    for lane in range(t.agents):
        assert len({r.session for r in t.requests if r.lane == lane}) >= 2
    # The variant's system prompt differs from the main one by a few tokens.
    main, variant = (_WORD.findall(t.systems[k]) for k in ("main", "variant"))
    changed = sum(
        max(i2 - i1, j2 - j1)
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(
            a=main, b=variant, autojunk=False
        ).get_opcodes()
        if op != "equal"
    )
    assert 0 < changed <= 4
    # The clock's timestamp changes within a session, inside the system prompt.
    clock = [r for r in t.requests if r.system.startswith("clock@")]
    assert any(
        len({r.system for r in clock if r.session == s}) >= 2 for s in {r.session for r in clock}
    )
    a, b = (_WORD.findall(t.systems[k]) for k in sorted({r.system for r in clock})[:2])
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert len(a) == len(b) and 1 <= len(diff) <= 2 and diff[-1] < 0.9 * len(a)


@pytest.mark.parametrize("agents", [2, 3])
def test_the_variant_phase_changes_one_word_deep_inside_the_system_prompt(agents):
    from clients.bench.agents.traffic import VARIANT_PHASE

    plain = build_traffic(seed=0, scale=0.5, agents=agents)
    t = build_traffic(seed=0, scale=0.5, agents=agents, variants=4)
    assert not any(r.phase for r in plain.requests)  # bench concurrency's traffic is as it was
    assert t.requests[: len(plain.requests)] == plain.requests
    phase = [r for r in t.requests if r.phase]
    assert {r.phase for r in phase} == {VARIANT_PHASE} and len(phase) == 12
    assert min(r.step for r in phase) > max(r.step for r in plain.requests)
    assert len({(r.step, r.lane) for r in t.requests}) == len(t.requests)  # a lane at a time
    firsts = sorted((r.step, r.system) for r in phase if r.kind == "first")
    assert len({s for s, _ in firsts}) == 4, "one new variant per step"
    main = _WORD.findall(t.systems["main"])
    texts = []
    for _, key in firsts:
        words = _WORD.findall(t.systems[key])
        diff = [i for i, (x, y) in enumerate(zip(main, words)) if x != y]
        assert len(words) == len(main) and len(diff) == 1, key
        assert diff[0] > 0.6 * len(main), "deep inside the system prompt"
        texts.append(words[diff[0]])
    assert len(set(texts)) == 4, "a different word per variant"
    for session in {r.session for r in phase}:
        kinds = [r.kind for r in phase if r.session == session]
        assert kinds == ["first", "tool_result", "user"]


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_the_message_phase_changes_a_long_message_near_its_end(scale):
    from clients.bench.agents.traffic import LONG_MESSAGE_TOKENS, MESSAGE_PHASE, VARIANT_PHASE

    plain = build_traffic(seed=0, scale=scale, variants=4)
    t = build_traffic(seed=0, scale=scale, variants=4, message_edits=4)
    main = [r for r in plain.requests if not r.phase]
    assert t.requests[: len(main)] == tuple(main)  # the main traffic is as it was
    phase = [r for r in t.requests if r.phase == MESSAGE_PHASE]
    variants = [r for r in t.requests if r.phase == VARIANT_PHASE]
    assert len(phase) == 12 and len(variants) == 12
    assert max(r.step for r in main) < min(r.step for r in phase)
    assert max(r.step for r in phase) < min(r.step for r in variants)
    assert len({(r.step, r.lane) for r in t.requests}) == len(t.requests)  # a lane at a time
    sessions = Sessions(t)
    changed = {}
    for spec in t.requests:
        messages = sessions.messages(spec)
        previous = sessions.previous(spec.session)
        if spec.kind in ("edit_inside", "truncate"):
            k = -1 if spec.kind == "edit_inside" else -3  # the long message, in `messages`
            old, new = previous[0][-1]["content"], messages[k]["content"]
            assert estimate_tokens(old) >= 0.9 * LONG_MESSAGE_TOKENS * scale
            shared = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
            changed[spec.kind] = changed.get(spec.kind, []) + [shared / len(old)]
            assert messages[:k] == previous[0][:-1]  # nothing before it changes
        if spec.kind == "truncate":
            assert messages[-2] == {"role": "assistant", "content": previous[1]}
            assert messages[-1]["role"] == "user"
        sessions.record(spec, messages, f"reply to {spec.rid}", completed=not spec.drop_after)
    # a line nine tenths into the pasted file; the tool output kept to its first 85%
    assert all(0.85 < x < 0.95 for x in changed["edit_inside"]), changed
    assert all(0.8 < x < 0.9 for x in changed["truncate"]), changed
    kinds = [[r.kind for r in phase if r.session == f"m{m}"] for m in range(4)]
    assert kinds == [["first", "edit_inside", "user"], ["first", "tool_result", "truncate"]] * 2


def test_scale_shrinks_the_traffic():
    full, small = build_traffic(scale=1.0), build_traffic(scale=0.05)
    f, s = full.summary(), small.summary()
    assert 9_000 <= f["prefix_tokens_estimate"] <= 11_000 and f["agents"] == 4
    assert s["prefix_tokens_estimate"] < f["prefix_tokens_estimate"] / 10
    assert s["agents"] < f["agents"] and s["requests"] < f["requests"]
    assert max(r.max_tokens for r in small.requests) < max(r.max_tokens for r in full.requests)


def test_sessions_append_replies_as_produced():
    t = build_traffic(seed=1, scale=0.05, agents=2)
    sessions = Sessions(t)
    for spec in t.requests:
        messages = sessions.messages(spec)
        assert messages[0] == {"role": "system", "content": t.systems[spec.system]}
        previous = sessions.previous(spec.session)
        if spec.base == "same":
            assert messages[1:] == previous[0][1:]
        elif spec.base == "edit":
            assert messages[1:-1] == previous[0][1:-1] and messages[-1]["role"] == "user"
            assert messages[-1] != previous[0][-1]
        elif spec.base == "extend":
            reply = messages[len(previous[0])]
            assert reply["role"] == "assistant" and reply["content"] == previous[1]
            assert reply.get("tool_calls", []) == list(spec.reply_tool_calls)
        sessions.record(spec, messages, f"reply to {spec.rid}", completed=not spec.drop_after)


# ------------------------------------------------------------------ oracle ----


@pytest.mark.parametrize(
    "steps, prompts, stored, expected",
    [
        # Nothing earlier: nothing to share.
        ([0], [[1, 2, 3]], [[1, 2, 3, 9]], [0]),
        # The same step runs concurrently: not earlier.
        ([0, 0], [[1, 2, 3], [1, 2, 4]], [[1, 2, 3], [1, 2, 4]], [0, 0]),
        # A prefix of an earlier prompt, and of an earlier reply beyond its prompt.
        (
            [0, 1, 2],
            [[1, 2, 3], [1, 2, 5, 6], [1, 2, 3, 7, 8, 9]],
            [[1, 2, 3, 7, 8], [1, 2, 5, 6], [1, 2, 3, 7, 8, 9]],
            [0, 2, 5],
        ),
        # A verbatim resend is capped at its length minus one.
        ([0, 1], [[4, 5, 6, 7], [4, 5, 6, 7]], [[4, 5, 6, 7, 1], [4, 5, 6, 7]], [0, 3]),
        # The longest over every earlier request wins.
        (
            [0, 1, 2],
            [[1, 1, 1], [2, 2, 2, 2], [2, 2, 2, 9, 9]],
            [[1, 1, 1], [2, 2, 2, 2], [2, 2, 2, 9, 9]],
            [0, 0, 3],
        ),
    ],
)
def test_oracle_on_hand_made_tokens(steps, prompts, stored, expected):
    def arrays(xs):
        return [np.asarray(x, dtype=np.int32) for x in xs]

    assert oracle_lengths(steps, arrays(prompts), arrays(stored)) == expected


def test_a_dropped_reply_is_not_shared():
    done = Observed(0, 0, 0, "first", np.array([1, 2, 3], np.int32), [4, 5], True)
    dropped = Observed(1, 0, 1, "first", np.array([6, 7], np.int32), [8, 9], False)
    assert done.stored.tolist() == [1, 2, 3, 4, 5]
    assert dropped.stored.tolist() == [6, 7]


def test_summarize_against_its_own_oracle():
    run = PolicyRun(
        "lineage",
        stats=[
            {"ram_bytes": 10, "disk_bytes": 100, "disk_bytes_written": 100, "evictions": 0},
            {"ram_bytes": 30, "disk_bytes": 60, "disk_bytes_written": 150, "evictions": 1},
            {"ram_bytes": 20, "disk_bytes": 160, "disk_bytes_written": 250, "evictions": 2},
        ],
    )

    def tokens(*xs):
        return np.asarray(xs, dtype=np.int32)

    run.observed = [
        Observed(0, 0, 0, "first", tokens(1, 2, 3, 4), [5], True, ttft_ms=100.0),
        Observed(1, 1, 0, "user", tokens(1, 2, 3, 4, 5, 6), [7], True, 4, "reply", 4, 10.0),
        Observed(2, 1, 1, "first", tokens(1, 2, 9), [], False),
    ]
    run.evictions = 2
    s = summarize(run, {1: "later", 2: "later"})
    assert (s["requests"], s["dropped"], s["cached_tokens"], s["oracle_cached_tokens"]) == (
        2,
        1,
        4,
        5,
    )
    assert s["oracle_fraction"] == pytest.approx(0.8)
    assert s["prefill_tokens"] == 10 - 4
    assert s["restore_kinds"] == {"none": 1, "reply": 1}
    assert (s["ram_bytes"], s["ram_bytes_peak"], s["disk_bytes"]) == (20, 30, 160)
    assert s["disk_bytes_per_turn"] == pytest.approx(250 / 2)
    # The phase's figures: its completed requests only, its sessions' first requests, its kinds.
    later = s["phases"]["later"]
    assert (later["requests"], later["cached_tokens"], later["oracle_cached_tokens"]) == (1, 4, 5)
    assert later["oracle_fraction"] == pytest.approx(0.8)
    assert later["first_oracle_cached_tokens"] == 0 and later["first_oracle_fraction"] == 1.0
    assert later["kinds"] == {
        "user": {
            "requests": 1,
            "cached_tokens": 4,
            "oracle_cached_tokens": 5,
            "oracle_fraction": pytest.approx(0.8),
        }
    }


# -------------------------------------------------------------- a real run ----


def test_small_run_against_every_policy(ray_session, random_model_dir, tmp_path, capsys):
    # The random-weight model: the run's figures need a hybrid model, not the trained one's
    # predictions, and its prefill is the faster one on a CPU.
    parser = argparse.ArgumentParser()
    agents.add_arguments(parser)
    out = tmp_path / "agents.json"
    argv = [
        "--scale",
        "0.05",
        "--agents",
        "2",
        "--seed",
        "0",
        "--ram-budget",
        "2G",
        "--variants",
        "2",
        "--message-edits",
        "2",
        "--policies",
        ",".join(POLICIES if deep() else ("lineage", "mlx_lm", "mlx_lm_server")),
        "--model",
        str(random_model_dir),
        "--json",
        str(out),
    ]
    try:
        import matplotlib  # noqa: F401  (the bench extra)

        argv += ["--plot", str(tmp_path / "agents.png")]
    except ImportError:
        pass
    assert agents.run(parser.parse_args(argv)) == 0
    assert "lineage" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report) >= {"traffic", "oracle", "policies"}
    ran = {"lineage", "mlx_lm", "mlx_lm_server"} | ({"exact", "off"} if deep() else set())
    assert set(report["policies"]) == ran
    for name, p in report["policies"].items():
        for key in (
            "cached_tokens",
            "oracle_fraction",
            "ttft_ms_p50",
            "ttft_ms_p90",
            "prefill_tokens",
            "ram_bytes",
            "disk_bytes",
            "evictions",
            "disk_bytes_per_turn",
            "restore_kinds",
        ):
            assert key in p, (name, key)
        assert p["ttft_ms_p90"] >= p["ttft_ms_p50"] > 0
        assert sum(p["restore_kinds"].values()) == p["requests"]
        assert p["cached_tokens"] <= p["oracle_cached_tokens"], name
        variants = p["phases"]["system_variants"]
        assert variants["requests"] == 6 and variants["oracle_cached_tokens"] > 0, name
        edits = p["phases"]["message_edits"]
        assert set(edits["kinds"]) == {"first", "edit_inside", "user", "tool_result", "truncate"}
    cached = {name: p["cached_tokens"] for name, p in report["policies"].items()}
    if deep():
        assert cached["lineage"] >= cached["exact"] >= cached["off"] == 0
    assert report["oracle"]["cached_tokens"] >= cached["lineage"] > 0
    if (tmp_path / "agents.png").exists():
        assert (tmp_path / "agents.png").stat().st_size > 10_000


def test_replica_comparison_reads_both_runs():
    from clients.bench.agents.replicas import compare, parse

    assert parse("lineage_x2") == ("lineage", 2) and parse("lineage") is None
    one = {"cached_tokens": 1000, "ttft_ms_p50": 10.0, "ttft_ms_p90": 30.0, "tokens_per_s": 500}
    two = dict(one, cached_tokens=980, ttft_ms_p50=8.0, tokens_per_s=700)
    two["replicas"] = {
        "requests": [5, 4],
        "handovers": 3,
        "handover_bytes": 3_000_000,
        "handovers_fetched": 3,
        "handovers_failed": 0,
        "handover_ms": 4.0,
        "probe_tokens": 900,
        "probe_bytes": 1_000_000,
        "cold_prefill_ms": 80.0,
        "handover_vs_cold": 0.05,
    }
    text = compare({"policies": {"lineage": one, "lineage_x2": two}})
    assert "lineage on 2 replicas" in text and "(0.980x; target >= 0.97x)" in text
    assert "(0.050x; target <= 0.1x)" in text and "[5, 4]" in text
    assert compare({"policies": {"lineage": one}}) == ""
