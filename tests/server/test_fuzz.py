"""Fuzz every field of GenerateRequest.

Each generated request either answers (a final event that is not an error, or
a stream we cut short after a few events) or fails with INVALID_ARGUMENT; a
well-formed stream running beside the fuzzing keeps its exact tokens. 150
cases here; `LINEAGE_DEEP_TESTS=1` runs 10,000.
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.proto import engine_pb2 as pb
from engine.proto import engine_pb2_grpc
from tests.deep import examples
from tests.fuzz import Witness


def lean(good, bad):
    """Mostly `good`, sometimes `bad`: so that cases reach past the first check."""
    return st.one_of(*[good] * 7, bad)


INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
ROLES = st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), st.text(max_size=12))
JSONISH = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "{}",
            "[]",
            '{"a": [1, {"b": null}]}',
            "[" * 40 + "]" * 40,
            "[" * 5000,
            '{"x": "' + "[" * 100 + '"}',
            '[{"type": "function", "function": {"name": "f", "parameters": {}}}]',
            '[{"type": "function", "function": {"name": "f", "parameters": []}}]',
            '[{"type": "web"}]',
        ]
    ),
)
IDENT = lean(
    st.one_of(st.just(""), st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True)),
    st.text(max_size=140),
)


@st.composite
def tool_calls(draw):
    return pb.ToolCall(
        id=draw(st.text(max_size=10)), name=draw(st.text(max_size=10)), arguments=draw(JSONISH)
    )


@st.composite
def messages(draw):
    return pb.Message(
        role=draw(lean(st.sampled_from(["user", "system"]), ROLES)),
        content=draw(st.text(max_size=60)),
        tool_calls=draw(lean(st.just([]), st.lists(tool_calls(), max_size=2))),
        tool_call_id=draw(lean(st.just(""), st.text(max_size=8))),
        name=draw(lean(st.just(""), st.text(max_size=8))),
    )


@st.composite
def samplings(draw):
    s = pb.Sampling(
        temperature=draw(lean(st.sampled_from([0.0, 0.7, 1.5]), FLOAT32)),
        top_p=draw(lean(st.sampled_from([0.0, 0.9, 1.0]), FLOAT32)),
        top_k=draw(lean(st.integers(0, 100), INT32)),
        max_tokens=draw(
            lean(st.integers(1, 6), st.one_of(st.integers(-3, 0), st.sampled_from([2**31 - 1])))
        ),
        stop=draw(
            lean(
                st.lists(st.text(max_size=4), max_size=3),
                st.lists(st.text(max_size=300), max_size=20),
            )
        ),
        stop_token_ids=draw(
            lean(st.lists(st.integers(0, 600), max_size=3), st.lists(INT32, max_size=70))
        ),
    )
    if draw(st.booleans()):
        s.seed = draw(lean(st.integers(0, 1000), INT64))
    return s


@st.composite
def requests(draw):
    req = pb.GenerateRequest(
        request_id=draw(IDENT),
        namespace=draw(IDENT),
        continue_final_message=draw(st.booleans()),
    )
    if draw(lean(st.just(True), st.just(False))):
        req.sampling.CopyFrom(draw(samplings()))
    if draw(st.booleans()):
        req.add_generation_prompt = draw(st.booleans())
    one = st.sampled_from(["messages", "ids", "text"]).map(lambda x: [x])
    sources = draw(lean(one, st.lists(st.sampled_from(["messages", "ids", "text"]), max_size=2)))
    if "messages" in sources:
        req.messages.extend(draw(st.lists(messages(), min_size=1, max_size=4)))
        req.tools_json = draw(lean(st.just(""), JSONISH))
    if "ids" in sources:
        ids = draw(
            lean(
                st.lists(st.integers(0, 600), min_size=1, max_size=40), st.lists(INT32, max_size=40)
            )
        )
        req.prompt_ids.ids.extend(ids)
    if "text" in sources:
        req.prompt_text = draw(st.text(min_size=1, max_size=80))
    return req


def run_case(stub, req: pb.GenerateRequest, most_events: int = 6) -> str:
    """'answered', 'cut' or 'invalid'; anything else fails the test."""
    call = stub.Generate(req, timeout=60)
    try:
        for i, ev in enumerate(call):
            if ev.WhichOneof("event") == "final":
                assert ev.final.finish_reason != "error", ev.final
                return "answered"
            if i + 1 >= most_events:
                call.cancel()
                return "cut"
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED:
            return "cut"
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details(), req)
        return "invalid"
    raise AssertionError(f"the stream ended without a final event: {req}")


@pytest.fixture(scope="module")
def fuzz_stub(engine):
    channel = grpc.insecure_channel(engine.address)
    yield engine_pb2_grpc.EngineStub(channel)
    channel.close()


def test_fuzzed_requests_answer_or_are_invalid(engine, fuzz_stub):
    witness = Witness(engine.address)
    outcomes: dict[str, int] = {}

    @settings(
        max_examples=examples(150, 10_000),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(requests())
    def case(req):
        outcome = run_case(fuzz_stub, req)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    try:
        case()
    finally:
        witness.stop()
    print(f"fuzz outcomes: {outcomes}, witness runs {witness.runs}")
    witness.check()
    assert outcomes.get("answered", 0) > 0 and outcomes.get("invalid", 0) > 0, outcomes
