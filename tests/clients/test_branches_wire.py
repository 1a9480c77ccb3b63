"""`n` through gRPC and the bridge: one prefill, n choices, the prompt counted once.

At temperature 0 the n choices equal the one-choice answer; `n` past the limit
(`--max-n`) is a 400 / INVALID_ARGUMENT naming it, and the server keeps serving.
"""

from __future__ import annotations

import grpc
import openai
import pytest

from clients.wire import build_request
from tests.clients.bridge.test_bridge import BridgeThread

pytestmark = pytest.mark.ray
USER = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(engine):
    b = BridgeThread(engine, in_process=True)
    with b.client() as c:
        yield c
    b.stop()


def test_chat_n_choices_count_the_prompt_once(client):
    one = client.chat.completions.create(
        model="lineage", messages=USER, max_tokens=8, temperature=0
    )
    four = client.chat.completions.create(
        model="lineage", messages=USER, max_tokens=8, temperature=0, n=4
    )
    assert [c.index for c in four.choices] == [0, 1, 2, 3]
    assert {c.message.content for c in four.choices} == {one.choices[0].message.content}
    assert four.usage.prompt_tokens == one.usage.prompt_tokens
    assert four.usage.completion_tokens == 4 * one.usage.completion_tokens


def test_streamed_n_choices_and_their_usage(client):
    stream = client.chat.completions.create(
        model="lineage",
        messages=USER,
        max_tokens=6,
        temperature=1.0,
        seed=3,
        n=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, reasons, usage = {}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    assert sorted(texts) == [0, 1, 2] and all(reasons.values())
    assert usage.completion_tokens == 18


def test_completions_n(client):
    r = client.completions.create(
        model="lineage", prompt="red green", max_tokens=5, temperature=0, n=2
    )
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text == r.choices[1].text


def test_n_past_the_limit_is_refused_naming_it(client, stub):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="lineage", messages=USER, max_tokens=2, n=9)
    assert "n must be in [1, 8]" in str(e.value)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Generate(build_request(prompt="x", max_tokens=2, n=9), timeout=60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "n must be" in e.value.details()
    assert client.chat.completions.create(model="lineage", messages=USER, max_tokens=2).choices


def test_grpc_events_carry_the_branch(stub):
    events = list(stub.Generate(build_request(prompt="a b", max_tokens=4, n=3), timeout=60))
    finals = [e.final for e in events if e.HasField("final")]
    assert sorted(f.index for f in finals) == [0, 1, 2]
    ids = {}
    for e in events:
        if e.HasField("chunk"):
            ids.setdefault(e.chunk.index, []).extend(e.chunk.ids)
    assert len(ids) == 3 and ids[0] == ids[1] == ids[2]
