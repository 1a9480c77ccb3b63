"""The client library: request conversion, the event and Result shapes, and the wire.

The conversions are pure (messages and requests to proto, events and Results
from it). The wire tests run against the real engine (the session `engine`
fixture: real gRPC on localhost, real Ray actors, real MLX):
generate/stream/stats/health, errors, and stream cancellation seen by the
server (its batch empties). Each test that relies on the cache uses a
namespace of its own (tests.clients.isolation).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from clients import client as lc
from clients import fanout
from engine.proto import engine_pb2
from tests.clients.isolation import free_port, fresh_ns


def active(engine) -> int:
    """Sequences in the engine's batch right now."""
    return engine.generator_stats().active


def wait_active(engine, done, timeout: float = 15) -> int:
    """Poll the batch size until done(active) or the deadline; the last value seen."""
    deadline = time.monotonic() + timeout
    while not done(n := active(engine)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def wait_idle(engine, timeout: float = 15) -> int:
    return wait_active(engine, lambda n: n == 0, timeout)


@pytest.fixture
def idle(engine):
    """The engine once its batch is empty: the cancellation tests count the batch."""
    assert wait_idle(engine) == 0, "an earlier request is still in the batch"
    return engine


# A prompt that streams prefill progress (>= 256 tokens): shared system text plus tools.
SYSTEM, TOOLS = fanout.make_shared_prefix(300, seed=4)
# A request that decodes until cancelled, for all the tests can tell: the tiny model's
# greedy reply to LONG runs ~4600 tokens before it emits EOS (20 s and more on a CPU),
# far past the few seconds a cancelled stream's slot takes to free.
LONG, SLOW = "1 2 3 4 5 6 7 8 9 10 11 12", 100_000


# ---------------------------------------------------------- conversions ----


def test_result_to_json_dict_shape():
    r = lc.Result(
        "hi",
        (1, 2),
        "stop",
        lc.Usage(10, 8, 2),
        lc.Restore("anchor", 8),
        lc.Timing(1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
        "rid",
        "0",
    )
    d = r.to_json_dict()
    assert d == {
        "text": "hi",
        "token_ids": [1, 2],
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 10, "cached_tokens": 8, "completion_tokens": 2},
        "restore": {"kind": "anchor", "length": 8},
        "timing": {
            "queue_ms": 1,
            "plan_ms": 2,
            "restore_ms": 3,
            "prefill_ms": 4,
            "commit_ms": 5,
            "ttft_ms": 6,
            "decode_tps": 7,
        },
        "request_id": "rid",
        "replica": "0",
        "incomplete": False,
    }
    json.dumps(d)


@pytest.mark.parametrize(
    "message, expected",
    [
        ({"role": "user", "content": "hi"}, dict(role="user", content="hi")),
        ({"role": "assistant", "content": None}, dict(role="assistant", content="")),
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            dict(role="user", content="ab"),
        ),
        (
            {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "calc"},
            dict(role="tool", content="42", tool_call_id="c1", name="calc"),
        ),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "g", "arguments": {"y": 2}},
                    },
                    {"id": "c3", "name": "h", "arguments": "{}"},
                ],
            },
            dict(
                role="assistant",
                content="",
                tool_calls=[
                    engine_pb2.ToolCall(id="c1", name="f", arguments='{"x": 1}'),
                    engine_pb2.ToolCall(id="c2", name="g", arguments='{"y": 2}'),
                    engine_pb2.ToolCall(id="c3", name="h", arguments="{}"),
                ],
            ),
        ),
    ],
)
def test_message_to_proto(message, expected):
    assert lc.message_to_proto(message) == engine_pb2.Message(**expected)


@pytest.mark.parametrize(
    "bad",
    [
        {"content": "no role"},
        "text",
        {"role": "user", "content": [{"type": "image_url"}]},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]},
    ],
)
def test_bad_message_raises_value_error(bad):
    with pytest.raises(ValueError):
        lc.message_to_proto(bad)


def test_build_request():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    r = lc.build_request(
        messages=[{"role": "user", "content": "x"}],
        tools=tools,
        max_tokens=5,
        stop="END",
        seed=0,
        namespace="ns",
        request_id="r1",
        session="agent-7",
    )
    assert r.session == "agent-7" and lc.build_request(prompt="p").session == ""
    assert json.loads(r.tools_json) == tools and r.add_generation_prompt
    assert (r.sampling.max_tokens, list(r.sampling.stop), r.sampling.seed) == (5, ["END"], 0)
    assert r.sampling.HasField("seed") and (r.namespace, r.request_id) == ("ns", "r1")
    assert not lc.build_request(prompt="p").sampling.HasField("seed")
    ids = lc.build_request(prompt_ids=[3, 4])
    assert ids.HasField("prompt_ids") and list(ids.prompt_ids.ids) == [3, 4]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"prompt": "a", "prompt_ids": [1]},
        {"messages": []},
        {"prompt": "a", "tools": [{"type": "function"}]},
        {"prompt": "a", "max_tokens": 0},
        {"messages": [{"role": "user", "content": "x"}], "tools": "not a list"},
    ],
)
def test_bad_request_raises_value_error(kwargs):
    with pytest.raises(ValueError):
        lc.build_request(**kwargs)


def test_event_from_proto_and_message_to_dict():
    assert lc.event_from_proto(
        engine_pb2.GenerateEvent(progress=engine_pb2.PrefillProgress(done=1, total=2))
    ) == lc.Progress(1, 2)
    assert lc.event_from_proto(
        engine_pb2.GenerateEvent(chunk=engine_pb2.TokenChunk(ids=[5], text="x"))
    ) == lc.Chunk((5,), "x")
    final = lc.event_from_proto(
        engine_pb2.GenerateEvent(
            final=engine_pb2.Final(
                finish_reason="stop", timing=engine_pb2.Timing(bytes_copied_commit=9)
            )
        )
    )
    assert final.restore.kind == "none" and final.timing.bytes_copied_commit == 9
    d = lc.message_to_dict(engine_pb2.CacheStatsReply(ram_bytes=1 << 40, hits={"anchor": 1}))
    assert d["ram_bytes"] == 1 << 40 and d["hits"] == {"anchor": 1} and d["evictions"] == 0


# ------------------------------------------------------ client over wire ----


def test_generate_stream_stats_and_health(engine):
    ns = fresh_ns()
    with lc.Client(engine.address, timeout=60) as c:
        c.wait_ready(5)
        c.wait_ready(5, service=lc.ENGINE_SERVICE)
        r = c.generate(prompt="a b c", max_tokens=3, namespace=ns)
        assert r.finish_reason in ("length", "stop") and 1 <= len(r.token_ids) <= 3
        assert r.usage.completion_tokens == len(r.token_ids) and r.usage.prompt_tokens > 0
        assert r.usage.cached_tokens == 0 and r.restore.kind == "none"
        assert r.timing.ttft_ms > 0 and r.request_id
        # greedy: the same request streamed gives the same tokens, chunk by chunk
        events = list(c.stream(prompt="a b c", max_tokens=3, namespace=fresh_ns()))
        chunks = [e for e in events if isinstance(e, lc.Chunk)]
        assert isinstance(events[-1], lc.Final) and events[-1].finish_reason == r.finish_reason
        assert "".join(e.text for e in chunks) == r.text
        assert tuple(i for e in chunks for i in e.ids) == r.token_ids

        # a long prompt streams prefill progress, then chunks, then the final event
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": fanout.user_message(0, 0)},
        ]
        events = list(c.stream(messages=msgs, tools=TOOLS, max_tokens=1, namespace=ns))
        kinds = [type(e) for e in events]
        assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == [
            lc.Progress,
            lc.Chunk,
            lc.Final,
        ]
        first = events[-1]
        assert {e.total for e in events if isinstance(e, lc.Progress)} == {
            first.usage.prompt_tokens
        }
        # turn two of the conversation restores turn one from the cache
        reply = "".join(e.text for e in events if isinstance(e, lc.Chunk))
        msgs += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": fanout.user_message(0, 1)},
        ]
        events = list(c.stream(messages=msgs, tools=TOOLS, max_tokens=1, namespace=ns))
        second = events[-1]
        assert second.usage.cached_tokens >= first.usage.prompt_tokens
        assert second.restore.kind != "none" and second.timing.restored_kv_bytes > 0

        stats = c.cache_stats()
        assert stats["mode"] == "lineage" and stats["hits"].get(second.restore.kind, 0) >= 1
        assert stats["prompt_tokens"] >= first.usage.prompt_tokens + second.usage.prompt_tokens
        info = c.model_info()
        assert (info["model"], info["model_type"], info["cache_mode"]) == (
            Path(engine.engine.info.path).name,  # the name, never the server's directories
            "qwen3_next",
            "lineage",
        )
        assert all(i < info["vocab_size"] for i in r.token_ids)


def test_errors_surface_as_lineage_error(engine):
    with lc.Client(engine.address, timeout=60) as c:
        with pytest.raises(lc.LineageError) as info:
            c.generate(prompt_ids=[5, 10**7], max_tokens=2)
        assert info.value.code == "INVALID_ARGUMENT" and "vocabulary" in info.value.message
        with pytest.raises(lc.LineageError) as info:
            list(c.stream(messages=[{"role": "wizard", "content": "hi"}], max_tokens=2))
        assert info.value.code == "INVALID_ARGUMENT" and "role" in info.value.message.lower()
        assert c.generate(prompt="still serving", max_tokens=1).usage.completion_tokens == 1
    with lc.Client(f"127.0.0.1:{free_port()}") as c:
        with pytest.raises(lc.LineageError) as info:
            c.wait_ready(0.3)
        assert info.value.code == "DEADLINE_EXCEEDED"
        with pytest.raises(lc.LineageError) as info:
            c.generate(prompt="x", max_tokens=1)
        assert info.value.code == "UNAVAILABLE"


@pytest.mark.parametrize("how", ["break", "cancel", "close"])
def test_sync_stream_cancels_the_call(idle, how):
    engine = idle
    with lc.Client(engine.address) as c:
        stream = c.stream(prompt=LONG, max_tokens=SLOW, namespace=fresh_ns())
        try:
            after = 0
            for event in stream:
                if after:
                    after += 1
                    assert after < 100, "the stream kept streaming after cancel"
                elif isinstance(event, lc.Chunk):
                    assert active(engine) == 1, "the request is not decoding"
                    if how == "break":
                        break
                    getattr(stream, how)()
                    after = 1
            # `stream` is still referenced: only the client's cancel can free the slot
            assert wait_idle(engine, 10) == 0, "the server is still decoding the stream"
            assert list(stream) == []
        finally:
            stream.cancel()


def test_async_client_generate_and_task_cancel(idle):
    engine = idle

    async def main():
        async with lc.AsyncClient(engine.address) as c:
            await c.wait_ready(5)
            r = await c.generate(
                messages=[{"role": "user", "content": "x"}], max_tokens=2, namespace=fresh_ns()
            )
            assert 1 <= len(r.token_ids) <= 2 and r.usage.completion_tokens == len(r.token_ids)
            stream = c.stream(prompt=LONG, max_tokens=SLOW, namespace=fresh_ns())
            task = asyncio.create_task(stream.result())
            assert await asyncio.to_thread(wait_active, engine, lambda n: n == 1) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(wait_idle, engine, 10) == 0
            second = c.stream(prompt=LONG, max_tokens=SLOW, namespace=fresh_ns())
            after = 0
            async for event in second:
                if after:
                    after += 1
                    assert after < 100, "the stream kept streaming after cancel"
                elif isinstance(event, lc.Chunk):
                    assert await asyncio.to_thread(active, engine) == 1
                    second.cancel()
                    after = 1
            assert await asyncio.to_thread(wait_idle, engine, 10) == 0
            assert (await c.cache_stats())["entries"] >= 1

    asyncio.run(main())
