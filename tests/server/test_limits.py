"""Limits on every input: each bad value is INVALID_ARGUMENT naming it,
and the server keeps serving. The table is checked without a server first, then over gRPC."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from types import SimpleNamespace

import grpc
import pytest

from engine.config import Limits
from engine.proto import engine_pb2 as pb
from engine.runtime.requests import SamplingParams
from engine.server.errors import InvalidRequest
from engine.server.prompts.prompt import PromptBuilder, PromptInput, parse_tools
from engine.server.rpc.requests import to_prompt_input
from engine.server.security.limits import (
    DEFAULT_LIMITS,
    check_identifier,
    check_sampling,
    json_depth,
    parse_json,
    printable,
    text_depth,
)
from tests.server.test_server import PROMPTS, collect, request


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


SAMPLING = [
    ("nan temperature", dict(temperature=math.nan), "temperature"),
    ("inf temperature", dict(temperature=math.inf), "temperature"),
    ("nan top_p", dict(top_p=math.nan), "top_p"),
    ("negative seed", dict(seed=-1), "seed"),
    ("17 stops", dict(stop=("x",) * 17), "stop strings"),
    ("long stop", dict(stop=("y" * 257,)), r"stop\[0\]"),
    ("65 stop ids", dict(stop_token_ids=(1,) * 65), "stop token ids"),
    ("stop id outside", dict(stop_token_ids=(10**6,)), "vocabulary"),
]


@pytest.mark.parametrize("name,change,needle", SAMPLING, ids=[s[0] for s in SAMPLING])
def test_sampling_limits(name, change, needle):
    with pytest.raises(InvalidRequest, match=needle):
        check_sampling(SamplingParams(max_tokens=4, **change), vocab_size=1000)


def test_sampling_at_the_limits_passes():
    ok = SamplingParams(
        max_tokens=4, seed=0, stop=("z" * 256,) * 16, stop_token_ids=(999,) * 64, top_p=1.0
    )
    check_sampling(ok, vocab_size=1000)


@pytest.mark.parametrize(
    "value,ok",
    [
        ("", True),
        ("req-1.a:b@c+d/e=f_g", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("has space", False),
        ("new\nline", False),
        ("\x1b[31mred", False),
        ("ünï", False),
    ],
)
def test_identifiers(value, ok):
    if ok:
        check_identifier("namespace", value)
    else:
        with pytest.raises(InvalidRequest, match="namespace"):
            check_identifier("namespace", value)


def test_printable_makes_log_safe_text():
    assert printable("a\nb\x1b") == repr("a?b?")
    assert printable("x" * 100, most=4) == repr("xxxx...")


def test_json_depth_is_bounded_without_recursion():
    assert json_depth([{"a": [1]}]) == 3 and json_depth(1) == 0
    parse_json("x", nested(DEFAULT_LIMITS.max_json_depth))
    with pytest.raises(InvalidRequest, match="nests 33 levels"):
        parse_json("x", nested(DEFAULT_LIMITS.max_json_depth + 1))
    with pytest.raises(InvalidRequest, match="tools_json nests 100000 levels deep"):
        parse_tools(nested(100_000))
    with pytest.raises(InvalidRequest, match="limit is"):
        parse_tools('[{"name": "' + "x" * DEFAULT_LIMITS.max_tools_bytes + '"}]')


def test_text_depth_counts_brackets_outside_strings_as_the_parser_nests():
    rng = random.Random(7)
    pieces = ['"', "\\", "[", "]", "{", "}", "a", ",", ":", "\n", "\u00e9"]

    def value(depth):
        kind = rng.randrange(4 if depth < 6 else 2)
        if kind == 0:
            return "".join(rng.choice(pieces) for _ in range(rng.randrange(6)))
        if kind == 1:
            return rng.choice([1, 2.5, None, True])
        if kind == 2:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        return {str(value(depth + 1)): value(depth + 1) for _ in range(rng.randrange(3))}

    examples = [value(0) for _ in range(300)]
    assert sum(json_depth(v) >= 3 for v in examples) > 20  # deep ones were made
    for v in examples:
        for text in (json.dumps(v), json.dumps(v, ensure_ascii=False, indent=1)):
            assert text_depth(text) == json_depth(v), text
            assert text_depth(text.encode()) == json_depth(v)


def test_deep_json_is_refused_before_the_parser_sees_it(monkeypatch):
    """Found in CI: the parser stopped by Python's recursion limit left the server's thread
    at that limit, where a finalizer the garbage collector ran failed (an unraisable
    RecursionError); the depth is now measured on the text first."""
    import engine.server.security.limits as limits

    seen = []

    def loads(text):
        seen.append(len(text))
        return json.loads(text)

    monkeypatch.setattr(limits, "json", SimpleNamespace(loads=loads, JSONDecodeError=ValueError))
    with pytest.raises(InvalidRequest, match="nests 5000 levels deep"):
        parse_json("tools_json", nested(5000))
    assert not seen, "the parser saw a text deeper than the limit"
    assert parse_json("x", nested(3)) == [[[]]] and seen


def test_add_generation_prompt_is_honoured():
    req = pb.GenerateRequest(messages=[pb.Message(role="user", content="hi")])
    assert to_prompt_input(req).add_generation_prompt  # unset: true
    req.add_generation_prompt = False
    assert not to_prompt_input(req).add_generation_prompt
    req.add_generation_prompt = True
    assert to_prompt_input(req).add_generation_prompt


class CountingTokenizer:
    """Encodes one token per character, and remembers the thread that encoded."""

    chat_template = None

    def __init__(self):
        self.threads = set()

    def encode(self, text, add_special_tokens=False):
        self.threads.add(threading.current_thread().name)
        return [ord(c) % 50 for c in text]


def test_the_anchor_memo_has_a_byte_cap():
    builder = PromptBuilder(CountingTokenizer(), 50, 10**6, limits=Limits(max_memo_bytes=10_000))
    for i in range(50):
        builder._tokens(f"{i:04d}" + "s" * 1000)  # ~9 KB each with its ids
        assert builder.memo_nbytes <= 10_000
    assert len(builder._memo) == 1
    builder._tokens("t" * 20_000)  # larger than the cap: computed, never kept
    assert builder.memo_nbytes <= 10_000 and "t" * 20_000 not in builder._memo


def test_prompts_are_built_off_the_event_loop():
    from engine.config import EngineConfig
    from engine.server.front.frontend import Frontend

    tok = CountingTokenizer()
    info = SimpleNamespace(vocab_size=50, max_context=10_000)
    frontend = Frontend([], None, PromptBuilder(tok, 50, 10_000), info, EngineConfig())
    prompt, _ = asyncio.run(
        frontend._prepare(PromptInput(prompt_text="hello"), SamplingParams(max_tokens=2))
    )
    assert len(prompt.tokens) == 5
    assert tok.threads and all(t.startswith("prompt-builder") for t in tok.threads)
    frontend.prompt_thread.shutdown()


# ------------------------------------------------------------ over gRPC ----


def _req(**kw):
    return request(prompt_ids=PROMPTS[0], max_tokens=2, **kw)


def _with(req, **fields):
    for k, v in fields.items():
        setattr(req, k, v)
    return req


def _user():
    return request(messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def _tool_args(depth):
    r = _user()
    r.messages.append(
        pb.Message(
            role="assistant",
            tool_calls=[pb.ToolCall(id="c1", name="f", arguments='{"a":' + nested(depth) + "}")],
        )
    )
    return r


GRPC_BAD = [
    ("nan temperature", _req(temperature=math.nan), "temperature"),
    ("inf temperature", _req(temperature=-math.inf), "temperature"),
    ("negative seed", _req(seed=-5), "seed"),
    ("17 stops", _req(stop=["a"] * 17), "stop strings"),
    ("long stop", _req(stop=["b" * 300]), "stop[0]"),
    ("request id charset", _with(_req(), request_id="a b"), "request_id"),
    ("request id length", _with(_req(), request_id="r" * 200), "request_id"),
    ("namespace charset", _with(_req(), namespace="x\n\x1b"), "namespace"),
    ("deep tools_json", _with(_user(), tools_json=nested(50_000)), "tools_json"),
    ("deep tool arguments", _tool_args(40), "arguments"),
    (
        "request bytes",
        pb.GenerateRequest(prompt_text="z" * (4 << 20) + "zz", sampling=pb.Sampling(max_tokens=1)),
        "bytes",
    ),
]


@pytest.mark.parametrize("name,req,needle", GRPC_BAD, ids=[b[0] for b in GRPC_BAD])
def test_limits_over_grpc(stub, name, req, needle):
    with pytest.raises(grpc.RpcError) as err:
        collect(stub, req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert needle in err.value.details()
    ids, _, _ = collect(stub, _req())  # still serving
    assert ids


def test_a_duplicate_request_id_in_flight_is_refused(stub):
    first = stub.Generate(_with(request(prompt_ids=PROMPTS[1], max_tokens=400), request_id="dup"))
    assert next(first).WhichOneof("event") in ("chunk", "progress")  # running now
    with pytest.raises(grpc.RpcError) as err:
        collect(stub, _with(_req(), request_id="dup"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already in flight" in err.value.details()
    first.cancel()
    deadline = time.monotonic() + 10
    while True:  # once the first has ended, the id is free again
        try:
            ids, _, final = collect(stub, _with(_req(), request_id="dup"))
            break
        except grpc.RpcError as e:
            assert "already in flight" in e.details() and time.monotonic() < deadline
            time.sleep(0.05)
    assert final.request_id == "dup" and ids


def test_add_generation_prompt_false_renders_no_assistant_turn(stub):
    msgs = [{"role": "user", "content": "hello there"}]
    with_turn = collect(stub, request(messages=msgs, max_tokens=1))[2]
    without = collect(
        stub, _with(request(messages=msgs, max_tokens=1), add_generation_prompt=False)
    )[2]
    assert without.usage.prompt_tokens < with_turn.usage.prompt_tokens


def test_a_stop_string_on_the_last_allowed_token_ends_only_that_request(stub):
    """Found by the fuzz test: a stop string matched on the token that also reached
    max_tokens failed the whole batch (the batch had already let the sequence go)."""
    from tokenizers import Tokenizer

    from engine.runtime.model.tiny_models import TOKENIZER_DIR

    # Greedy on the embedded trained model: an indented docstring whose 4th token is a
    # word (' the'), not whitespace, and not in the first three's text.
    tokenizer = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    prompt = tokenizer.encode("def parse_args(argv=None):\n", add_special_tokens=False).ids
    _, text3, _ = collect(stub, request(prompt_ids=prompt, max_tokens=3))
    _, text4, _ = collect(stub, request(prompt_ids=prompt, max_tokens=4))
    last = text4[len(text3) :]
    if not last.strip() or last in text3:
        pytest.skip(f"the 4th token's text {last!r} cannot serve as a stop string here")
    ids, text, final = collect(stub, request(prompt_ids=prompt, max_tokens=4, stop=[last]))
    assert final.finish_reason == "stop" and text == text3
