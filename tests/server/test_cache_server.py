"""The lineage cache through the running server: real gRPC, Ray and MLX, on the
session's random-weight engine and two of its own (exact and off modes).

Each test uses a namespace of its own, so entries of one test never serve
another. The system prompt plus tools is ~900 tokens, long enough for a guard
checkpoint (the uncached suffix of a first turn is >= 256 tokens).
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest

from clients.client import Client
from clients.fanout import make_shared_prefix, user_message

SYSTEM, TOOLS = make_shared_prefix(900, seed=3)
_ns = itertools.count()


def fresh_ns(tag: str) -> str:
    return f"{tag}-{next(_ns)}"


@pytest.fixture(scope="module")
def client(random_engine):
    with Client(random_engine.address, timeout=120) as c:
        yield c


def chat(client, messages, ns, max_tokens=6, **kw):
    return client.generate(
        messages=messages, tools=TOOLS, max_tokens=max_tokens, namespace=ns, **kw
    )


def convo(*users, system=SYSTEM):
    return [{"role": "system", "content": system}] + [{"role": "user", "content": u} for u in users]


def test_turn_two_restores_turn_one(client):
    ns = fresh_ns("turns")
    msgs = convo(user_message(0, 0))
    r1 = chat(client, msgs, ns)
    assert r1.restore.kind == "none" and r1.usage.cached_tokens == 0
    msgs2 = msgs + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": user_message(0, 1)},
    ]
    r2 = chat(client, msgs2, ns)
    assert r2.usage.cached_tokens >= r1.usage.prompt_tokens
    assert r2.restore.kind in ("entry", "reply")


def test_verbatim_resend_restores_the_whole_prompt(client):
    ns = fresh_ns("resend")
    msgs = convo(user_message(1, 0))
    r1 = chat(client, msgs, ns)
    r2 = chat(client, msgs, ns)
    assert r2.restore.kind == "reply", "the prompt end, with its kept logits"
    assert r2.usage.cached_tokens == r1.usage.prompt_tokens, "zero tokens prefilled"
    assert r2.text == r1.text, "greedy output from a restore equals the cold output"


def test_new_session_lands_on_the_anchor(client):
    ns = fresh_ns("anchor")
    r1 = chat(client, convo(user_message(2, 0)), ns)
    r2 = chat(client, convo("A completely different first question about parsers."), ns)
    assert r2.restore.kind == "anchor"
    stats = client.cache_stats()
    assert stats["anchors"] >= 1
    assert r2.usage.cached_tokens >= r1.usage.prompt_tokens - 40  # the anchor covers system+tools


def test_edited_last_message_restores_at_turn_boundary(client):
    ns = fresh_ns("edit")
    msgs = convo(user_message(3, 0))
    r1 = chat(client, msgs, ns)
    msgs2 = msgs + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": user_message(3, 1)},
    ]
    r2 = chat(client, msgs2, ns)
    edited = msgs + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": "Actually, do something else entirely."},
    ]
    r3 = chat(client, edited, ns)
    assert r3.restore.kind in ("final", "reply", "entry")
    # the turn boundary: turn one's prompt plus its reply
    assert r3.usage.cached_tokens >= r1.usage.prompt_tokens
    assert r3.usage.cached_tokens < r2.usage.prompt_tokens


def test_regenerate_restores_the_prompt(client):
    ns = fresh_ns("regen")
    msgs = convo(user_message(4, 0))
    r1 = chat(client, msgs, ns)
    turn_two = msgs + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": user_message(4, 1)},
    ]
    r2 = chat(client, turn_two, ns)
    regen = chat(client, turn_two, ns, temperature=0.9, seed=5)
    # a regenerate is a verbatim resend: it restores turn two's prompt end whole and
    # samples its first token from the kept logits (at its own temperature)
    assert regen.restore.kind == "reply"
    assert regen.usage.cached_tokens == r2.usage.prompt_tokens


def test_retry_after_cancel_mid_stream(client, random_engine):
    from clients.client import Chunk

    ns = fresh_ns("retry")
    msgs = convo(user_message(5, 0))
    stream = client.stream(messages=msgs, tools=TOOLS, max_tokens=400, namespace=ns)
    chunks = 0
    for event in stream:
        chunks += isinstance(event, Chunk)
        if chunks >= 3:
            break  # the client drops the stream mid-reply
    stream.cancel()
    r = chat(client, msgs, ns)
    # the cancelled call committed its prompt end: the retry prefills nothing
    assert r.restore.kind == "reply"
    assert r.usage.cached_tokens == r.usage.prompt_tokens


def test_retry_after_cancel_in_prefill_resumes_the_prefix(client):
    from clients.client import Progress

    ns = fresh_ns("retry-prefill")
    msgs = convo(user_message(5, 1))
    stream = client.stream(messages=msgs, tools=TOOLS, max_tokens=4, namespace=ns)
    for event in stream:
        if isinstance(event, Progress):
            break  # dropped after the first prefill chunk
    stream.cancel()
    r = chat(client, msgs, ns)
    # The prefix's own entry, not the anchor (which the prefill may have stored too):
    # a retry that found only the anchor would mean the prefix was thrown away.
    assert r.restore.kind == "entry", r.restore
    assert 256 <= r.usage.cached_tokens < r.usage.prompt_tokens


def test_four_token_system_variant_reuses_all_but_its_tail(client):
    ns = fresh_ns("variant")
    tail_a = " Reply in English. Keep answers short and precise."
    tail_b = " Reply in French. Keep answers short and precise."
    chat(client, convo(user_message(6, 0), system=SYSTEM + tail_a), ns)
    first_b = chat(client, convo(user_message(6, 0), system=SYSTEM + tail_b), ns)
    # a third request that shares the common part lands on the divergence checkpoint
    tail_c = " Reply in German. Keep answers short and precise."
    r = chat(client, convo(user_message(6, 1), system=SYSTEM + tail_c), ns)
    assert r.restore.kind == "divergence"
    assert r.usage.cached_tokens >= first_b.usage.prompt_tokens - 80


def test_parallel_sessions_share_the_anchor(client):
    ns = fresh_ns("parallel")
    first = chat(client, convo(user_message(7, 0)), ns)
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda a: chat(client, convo(user_message(10 + a, 0)), ns), range(4))
        )
    for r in results:
        assert r.restore.kind == "anchor", r.restore
        assert r.usage.cached_tokens >= first.usage.prompt_tokens - 60


def test_cache_stats_count_hits_and_checkpoints(client):
    """What one cold turn and one warm turn add to the counters (whatever ran before)."""
    ns = fresh_ns("stats")
    before = client.cache_stats()
    msgs = convo(user_message(30, 0))
    r1 = chat(client, msgs, ns)
    turn_two = msgs + [
        {"role": "assistant", "content": r1.text},
        {"role": "user", "content": user_message(30, 1)},
    ]
    r2 = chat(client, turn_two, ns)
    after = client.cache_stats()
    assert after["mode"] == "lineage"
    hits = {k: after["hits"].get(k, 0) - before["hits"].get(k, 0) for k in after["hits"]}
    assert sum(hits.values()) == 2 and hits.get(r2.restore.kind) >= 1, hits
    assert after["prompt_tokens"] - before["prompt_tokens"] == (
        r1.usage.prompt_tokens + r2.usage.prompt_tokens
    )
    assert after["cached_tokens"] - before["cached_tokens"] == r2.usage.cached_tokens > 0
    assert after["entries"] >= 1 and after["ram_bytes"] > 0
    assert after.get("restores_lost", 0) == before.get("restores_lost", 0)


@pytest.fixture(scope="module")
def exact_engine(ray_session, model_cache_dir, random_model_dir):
    from engine.server.running.background import BackgroundEngine
    from tests.engines import make_config

    e = BackgroundEngine(make_config(model_cache_dir, model=random_model_dir, mode="exact"))
    yield e
    e.stop()


@pytest.fixture(scope="module")
def off_engine(ray_session, model_cache_dir, random_model_dir):
    from engine.server.running.background import BackgroundEngine
    from tests.engines import make_config

    e = BackgroundEngine(make_config(model_cache_dir, model=random_model_dir, mode="off"))
    yield e
    e.stop()


def test_exact_mode_hits_whole_prompts_only(exact_engine, client):
    with Client(exact_engine.address, timeout=120) as ex:
        ns = fresh_ns("exact")
        msgs = convo(user_message(8, 0))
        r1 = chat(ex, msgs, ns)
        resend = chat(ex, msgs, ns)
        assert resend.usage.cached_tokens >= r1.usage.prompt_tokens - 16
        assert resend.text == r1.text
        # a new session with the same system prompt: exact mode has no anchor, so it
        # prefills the shared system prompt again, where lineage mode restores it
        other = chat(ex, convo("Something unrelated to the first session."), ns)
        assert (other.restore.kind, other.usage.cached_tokens) == ("none", 0)
        assert ex.cache_stats()["mode"] == "exact"
        compare = fresh_ns("exact-compare")
        chat(client, msgs, compare)
        lineage_other = chat(client, convo("Something unrelated to the first session."), compare)
        assert lineage_other.restore.kind == "anchor"
        assert lineage_other.usage.cached_tokens >= r1.usage.prompt_tokens // 2


def test_off_mode_caches_nothing(off_engine):
    with Client(off_engine.address, timeout=120) as off:
        msgs = convo(user_message(9, 0))
        r1 = chat(off, msgs, "")
        r2 = chat(off, msgs, "")
        assert r1.usage.cached_tokens == 0 and r2.usage.cached_tokens == 0
        assert r2.restore.kind == "none" and r2.text == r1.text
        assert off.cache_stats()["entries"] == 0


def test_sub_agents_arriving_together_pay_the_shared_prefix_once(client):
    """Parallel first turns: one prefills the system prompt, the others wait for its anchor."""
    ns = fresh_ns("together")
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda a: chat(client, convo(user_message(20 + a, 0)), ns), range(4))
        )
    kinds = sorted(r.restore.kind for r in results)
    assert kinds == ["anchor", "anchor", "anchor", "none"], kinds
    anchored = [r for r in results if r.restore.kind == "anchor"]
    cold = next(r for r in results if r.restore.kind == "none")
    assert all(r.usage.cached_tokens >= cold.usage.prompt_tokens - 60 for r in anchored)
    assert client.cache_stats()["anchors"] >= 1
