"""Log-probabilities per token: chat-completions, completions and gRPC, on the embedded model.

At temperature 0 the chosen token is the most likely one, so each token's
log-probability is the first of its top alternatives; under a constraint the
alternatives are only tokens the grammar allows (the log-probabilities after
the mask). A `top_logprobs` past 20 is a 400 naming the field.
"""

from __future__ import annotations

import math

import openai
import pytest

from clients.wire import build_request
from tests.clients.bridge.test_bridge import BridgeThread

pytestmark = pytest.mark.ray
USER = [{"role": "user", "content": "Count to three."}]


@pytest.fixture(scope="module")
def client(engine):
    b = BridgeThread(engine, in_process=True)
    with b.client() as c:
        yield c
    b.stop()


def test_chat_logprobs_whole_and_streamed(client):
    r = client.chat.completions.create(
        model="lineage", messages=USER, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert math.isclose(entry.logprob, tops[0], abs_tol=1e-5) and entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
    streamed = client.chat.completions.create(
        model="lineage",
        messages=USER,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        stream=True,
    )
    entries = [e for c in streamed for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert [e.logprob for e in entries] == [e.logprob for e in content]


def test_logprobs_under_a_constraint_are_after_the_mask(client):
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": {"enum": ["yes", "no"]}, "strict": True},
    }
    r = client.chat.completions.create(
        model="lineage",
        messages=USER,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
        response_format=fmt,
    )
    assert r.choices[0].message.content in ('"yes"', '"no"')
    first = r.choices[0].logprobs.content[0]
    assert first.top_logprobs and all(t.token.lstrip().startswith('"') for t in first.top_logprobs)
    assert math.isclose(sum(math.exp(t.logprob) for t in first.top_logprobs), 1.0, abs_tol=1e-3)


def test_completions_logprobs(client):
    r = client.completions.create(
        model="lineage", prompt="one two", max_tokens=6, temperature=0, logprobs=3
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    assert all(len(t) == 3 for t in lp.top_logprobs)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_logprobs_are_a_400_naming_the_field(client, kwargs, field):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="lineage", messages=USER, max_tokens=2, **kwargs)
    assert field in str(e.value)
    assert client.chat.completions.create(model="lineage", messages=USER, max_tokens=2).choices


def test_grpc_carries_logprobs_per_token(stub):
    request = build_request(prompt="a b c", max_tokens=5, logprobs=True, top_logprobs=2)
    events = list(stub.Generate(request, timeout=60))
    chunks = [e.chunk for e in events if e.HasField("chunk")]
    ids = [i for c in chunks for i in c.ids]
    logprobs = [lp for c in chunks for lp in c.logprobs]
    assert len(ids) == len(logprobs) == 5
    assert all(len(lp.top_ids) == 2 and lp.top_ids[0] == i for i, lp in zip(ids, logprobs))
    bad = build_request(prompt="a", max_tokens=2, logprobs=True, top_logprobs=21)
    with pytest.raises(Exception) as e:
        list(stub.Generate(bad, timeout=60))
    assert "top_logprobs" in str(e.value)
