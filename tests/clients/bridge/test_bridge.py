"""The OpenAI-compatible bridge: the official `openai` client against the real bridge,
the real gRPC server, Ray and MLX (plus the tool-call parser on plain text)."""

from __future__ import annotations

import json
import logging
import time
import uuid

import httpx
import openai
import pytest

from clients.bridge.chat_completions import ChatShape
from clients.bridge.parsers import make_parser
from clients.bridge.server import start_bridge
from clients.client import Final, Restore, Result, Timing, Usage
from engine.server.running.background import BackgroundLoop


class BridgeThread:
    """A bridge serving on a free port: a client of the engine's gRPC address from an event
    loop of its own (`lineage bridge`), or in the engine's own process and loop, calling its
    front end (`lineage serve --http-port`)."""

    def __init__(self, engine, security=None, options=None, in_process: bool = False):
        """`engine`: a BackgroundEngine, or a gRPC address (for the gRPC way alone)."""
        if in_process:
            from clients.bridge.in_process import InProcessBackend

            self.background, self.owned = engine.background, False
            backend = InProcessBackend(engine.engine)
            self.handle = self.call(start_bridge(backend, "127.0.0.1", 0, security, options))
        else:
            address = engine if isinstance(engine, str) else engine.address
            self.background, self.owned = BackgroundLoop("bridge-loop"), True
            self.handle = self.call(start_bridge(address, "127.0.0.1", 0, security, options))
        self.url = self.handle.url

    def call(self, coro, timeout: float = 60):
        return self.background.call(coro, timeout)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120
        )

    def stop(self) -> None:
        try:
            self.call(self.handle.stop(grace=1.0))
        finally:
            if self.owned:
                self.background.close()


@pytest.fixture(scope="module", params=["grpc", "in_process"])
def bridge(engine, request):
    """Every bridge test runs on both ways to the engine."""
    b = BridgeThread(engine, in_process=request.param == "in_process")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def client(bridge):
    with bridge.client() as c:
        yield c


USER = [{"role": "user", "content": "Say something about prompt caches."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite and report failures",
            "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
        },
    },
]
# About 900 tokens of shared system prompt, as parallel sub-agents send.
SYSTEM = "You are a careful coding agent working in a large repository.\n" + "\n".join(
    f"Rule {i}: keep module {i} tidy, test every change to it, and answer in short sentences."
    for i in range(60)
)


def stream_text(stream) -> tuple[str, str | None, object]:
    """(text, finish_reason, usage) of a streamed chat completion."""
    text, reason, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
    return text, reason, usage


# ------------------------------------------------------------ chat shape ----

CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.py"}}\n</tool_call>'


def test_a_tool_call_becomes_tool_calls_whole_and_streamed():
    """The chat shapes, checked against the openai package's own response types."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    info = {"id": "tiny", "fingerprint": "fp"}
    text, usage = (
        "<think>The file first.</think>\n\nChecking.\n" + CALL,
        Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=30),
    )
    whole = ChatCompletion.model_validate(
        ChatShape("r1", info, make_parser("qwen")).whole(Result(text, (), "stop", usage))
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert choice.message.reasoning_content == "The file first."
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("read_file", {"path": "setup.py"})
    ]
    assert whole.usage.prompt_tokens_details.cached_tokens == 32

    shape = ChatShape("r2", info, make_parser("qwen"))
    chunks = shape.head() + [
        c for i in range(0, len(text), 4) for c in shape.delta(text[i : i + 4])
    ]
    chunks += shape.finish(Final("stop", usage, Restore(), Timing(), "r2"))
    chunks = [ChatCompletionChunk.model_validate(c) for c in chunks]
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Checking."
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == (
        "The file first."
    )
    calls = [t for d in deltas for t in d.tool_calls or ()]
    assert [(t.index, t.function.name) for t in calls if t.function.name] == [(0, "read_file")]
    assert json.loads("".join(t.function.arguments or "" for t in calls)) == {"path": "setup.py"}
    assert calls[0].id.startswith("call_") and calls[0].type == "function"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert (
        ChatCompletionChunk.model_validate(
            shape.usage_chunk(Final("stop", usage, Restore(), Timing(), "r2"))
        ).usage.total_tokens
        == 70
    )


def test_a_malformed_tool_call_is_content_with_a_warning(caplog):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    info = {"id": "tiny", "fingerprint": "fp"}
    text, usage = "Try.<tool_call>\n{nope}\n</tool_call>", Usage(10, 0, 5)
    with caplog.at_level(logging.WARNING, logger="lineage.bridge"):
        whole = ChatShape("r3", info, make_parser("qwen")).whole(Result(text, (), "stop", usage))
        shape = ChatShape("r4", info, make_parser("qwen"))
        chunks = [c for i in range(len(text)) for c in shape.delta(text[i])]
        chunks += shape.finish(Final("stop", usage, Restore(), Timing(), "r4"))
    choice = ChatCompletion.model_validate(whole).choices[0]
    assert (choice.message.content, choice.finish_reason) == (text, "stop")
    assert not choice.message.tool_calls
    deltas = [ChatCompletionChunk.model_validate(c).choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == text
    assert not any(d.tool_calls for d in deltas)
    warned = [r for r in caplog.records if "did not parse" in r.getMessage()]
    assert [r.getMessage().split()[1] for r in warned] == ["r3:", "r4:"]


# --------------------------------------------------------- chat, served ----


def test_streamed_text_equals_non_streamed_at_temperature_0(client):
    args = {"model": "lineage", "messages": USER, "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**args)
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens > 5 and 1 <= whole.usage.completion_tokens <= 12
    assert whole.usage.prompt_tokens_details.cached_tokens >= 0
    streamed = args | {"max_tokens": None, "max_completion_tokens": 12, "stream": True}
    text, reason, usage = stream_text(client.chat.completions.create(**streamed))
    assert text == choice.message.content and reason == choice.finish_reason
    assert usage is None, "usage chunk without stream_options.include_usage"
    if len(text) > 6:  # a stop string, given as a str
        cut = client.chat.completions.create(**args, stop=text[3:6]).choices[0]
        assert cut.finish_reason == "stop" and text.startswith(cut.message.content)
        assert text[3:6] not in cut.message.content


def test_shared_system_prompt_and_tools_are_cached(client):
    """The second sub-agent's turn reuses the first one's system prompt + tools."""
    usages = []
    for question in ("Which tests fail?", "Read setup.py, please."):
        stream = client.chat.completions.create(
            model="lineage",
            max_tokens=3,
            temperature=0,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Cache-Namespace": "bridge-shared-prompt"},
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        )
        usages.append(stream_text(stream)[2])
    first, second = usages
    assert first is not None and second is not None, "no usage chunk with include_usage"
    assert first.prompt_tokens > 600
    assert second.prompt_tokens_details.cached_tokens > 0, "the shared prefix was not reused"


def test_namespace_comes_from_the_header_alone(client):
    """X-Cache-Namespace names the namespace; `user` names the session, never a namespace."""
    messages = [
        {"role": "system", "content": SYSTEM + "\nNamespaces."},
        {"role": "user", "content": "Hello."},
    ]

    def cached(**kwargs) -> int:
        reply = client.chat.completions.create(
            model="lineage", messages=messages, max_tokens=2, temperature=0, **kwargs
        )
        return reply.usage.prompt_tokens_details.cached_tokens

    a, b, c = (f"bridge-ns-{x}-{uuid.uuid4().hex[:8]}" for x in "abc")  # fresh per bridge
    cached(extra_headers={"X-Cache-Namespace": a})
    assert cached(extra_headers={"X-Cache-Namespace": b}) == 0, "another namespace reused a's"
    assert cached(extra_headers={"X-Cache-Namespace": b}, user=c) > 0, "user split the cache"


def test_session_keys_are_read_in_one_order():
    from types import SimpleNamespace

    from clients.bridge.engine_call import Asked, hints_of, session_of

    body = SimpleNamespace(prompt_cache_key="pck", metadata={"user_id": "cc"}, user="u")
    headers = {"x-session-id": "h1", "session_id": "h2", "x-session-affinity": "h3"}
    asked = Asked(**hints_of(body))
    assert session_of(headers, asked) == "pck"
    asked = Asked(**hints_of(SimpleNamespace(metadata={"user_id": "cc"}, user="u")))
    assert session_of(headers, asked) == "h1"
    assert session_of({"session_id": "h2", "x-session-affinity": "h3"}, asked) == "h2"
    assert session_of({"x-session-affinity": "h3"}, asked) == "h3"
    assert session_of({}, asked) == "cc"
    assert session_of({}, Asked(**hints_of(SimpleNamespace(user="u")))) == "u"
    assert session_of({}, Asked(**hints_of(SimpleNamespace(metadata=["odd"])))) == ""
    odd = session_of({"x-session-id": "Zoë's session #1"}, Asked())
    assert odd.startswith("h:") and len(odd) == 34  # hashed: a routing hint never fails


def test_an_odd_session_key_is_served(client):
    reply = client.chat.completions.create(
        model="lineage",
        messages=USER,
        max_tokens=2,
        temperature=0,
        user="someone@example.com",
        extra_body={"prompt_cache_key": "a key with spaces and ✓"},
        extra_headers={"X-Cache-Namespace": "bridge-sessions"},
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_reasoning_sent_back_reaches_the_template(client):
    """An assistant turn's reasoning_content is rendered again (the embedded template takes
    it), so its tokens are those the model generated and the cache holds."""

    def prompt_tokens(assistant: dict) -> int:
        messages = USER + [assistant, {"role": "user", "content": "Go on."}]
        reply = client.chat.completions.create(
            model="lineage", messages=messages, max_tokens=1, temperature=0
        )
        return reply.usage.prompt_tokens

    plain = prompt_tokens({"role": "assistant", "content": "Caches keep prefixes."})
    reasoned = prompt_tokens(
        {
            "role": "assistant",
            "content": "Caches keep prefixes.",
            "reasoning_content": "The user asks about caches; say what they keep.",
        }
    )
    assert reasoned > plain + 8


def test_tool_call_round_trip_renders_and_runs(client):
    turn = [
        {"role": "developer", "content": "You are terse."},  # the system role's new name
        {"role": "user", "content": "What is in setup.py?"},
    ]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "setup.py"}'},
    }
    follow_up = turn + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"},
    ]
    a = client.chat.completions.create(model="lineage", messages=turn, tools=TOOLS, max_tokens=2)
    b = client.chat.completions.create(
        model="lineage", messages=follow_up, tools=TOOLS, max_tokens=2
    )
    assert b.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The call and its result are in the rendered prompt.
    assert b.usage.prompt_tokens > a.usage.prompt_tokens + 15


BAD_REQUESTS = [
    ("max_tokens 0", {"max_tokens": 0}, "max_tokens"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ("negative temperature", {"temperature": -1.0}, "temperature"),
    ("messages not a list", {"messages": "hello"}, "messages"),
    ("too many choices", {"n": 9}, "n must be in [1, 8]"),
]


@pytest.mark.parametrize(
    "override,needle", [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS]
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_bad_request_is_400_and_the_bridge_keeps_serving(client, override, needle, stream):
    args = {"model": "lineage", "messages": USER, "max_tokens": 2, "stream": stream} | override
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    assert err.value.status_code == 400
    assert needle in err.value.message.lower()
    assert err.value.body["type"] == "invalid_request_error"
    ok = client.chat.completions.create(model="lineage", messages=USER, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("bad_id", [2**31, 2972860639, -1])
def test_a_token_id_outside_int32_is_400_naming_it(client, bad_id):
    """Found by the bridge fuzz: an id the wire cannot carry was a 500."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="lineage", prompt=[5, bad_id], max_tokens=2)
    assert "prompt_ids[1]" in err.value.message
    ok = client.completions.create(model="lineage", prompt=[5, 6], max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"top_k": -107844676818076}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"seed": 2**63}, "seed"),
        ({"max_tokens": 2**31}, "max_tokens"),
    ],
)
def test_a_sampling_value_outside_its_wire_field_is_400_naming_it(client, extra, named):
    """Found by the deep bridge fuzz: an int the proto's field cannot carry was a 500."""
    args = {"model": "lineage", "prompt": [5, 6], "max_tokens": 2}
    body = {k: v for k, v in extra.items() if k not in args}
    args.update({k: v for k, v in extra.items() if k in args})
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**args, extra_body=body or None)
    assert named in err.value.message
    ok = client.completions.create(model="lineage", prompt=[5, 6], max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


# Greedy on the embedded trained model, this raw prompt loops on "import sys" for its
# 4000 tokens (about 20 s on CI's CPU; a chat turn it copies and ends): a slot freed
# within FREED_WITHIN_S was freed by the cancel, not by the end.
ENDLESS = "import os\nimport sys\n"
FREED_WITHIN_S = 5.0


def wait_until_idle(engine, within: float) -> None:
    deadline = time.time() + within
    while engine.generator_stats().active and time.time() < deadline:
        time.sleep(0.05)
    assert engine.generator_stats().active == 0, "the abandoned request is still in the batch"


def test_abandoned_stream_frees_its_slot(engine, client):
    stream = client.completions.create(
        model="lineage", prompt=ENDLESS, max_tokens=4000, temperature=0, stream=True
    )
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].text)
        if seen == 3:
            break
    assert seen == 3, "the model stopped before the stream could be abandoned"
    assert engine.generator_stats().active == 1
    stream.close()
    wait_until_idle(engine, FREED_WITHIN_S)
    ok = client.chat.completions.create(model="lineage", messages=USER, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_abandoned_whole_request_frees_its_slot(engine, bridge):
    body = {"model": "lineage", "prompt": ENDLESS, "max_tokens": 4000, "temperature": 0}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{bridge.url}/v1/completions", json=body, timeout=1.0)
    wait_until_idle(engine, FREED_WITHIN_S)


# ------------------------------------------ completions, models, health ----


def test_completions_models_and_health(bridge, client):
    whole = client.completions.create(
        model="lineage", prompt="Once upon a time", max_tokens=6, temperature=0
    )
    assert whole.object == "text_completion" and whole.usage.completion_tokens >= 1
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="lineage", prompt="Once upon a time", max_tokens=6, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == whole.choices[0].text
    by_ids = client.completions.create(model="lineage", prompt=[5, 17, 300, 42], max_tokens=2)
    assert by_ids.usage.prompt_tokens == 4
    models = client.models.list().data  # the served names: "lineage", the model's own
    assert [m.id for m in models] == ["lineage", models[1].root] and whole.model == "lineage"
    health = httpx.get(f"{bridge.url}/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "SERVING"}
    missing = httpx.get(f"{bridge.url}/v1/nothing", timeout=10)
    assert missing.status_code == 404 and "error" in missing.json()


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_is_429(engine, client, stream):
    frontend = engine.engine.frontend
    frontend.max_queue = 0
    try:
        with pytest.raises(openai.RateLimitError) as err:
            reply = client.chat.completions.create(
                model="lineage", messages=USER, max_tokens=2, stream=stream
            )
            list(reply) if stream else None
        assert err.value.status_code == 429 and err.value.body["code"] == "resource_exhausted"
    finally:
        frontend.max_queue = 256
    assert client.chat.completions.create(model="lineage", messages=USER, max_tokens=2)


def test_engine_unavailable_is_503():
    b = BridgeThread("127.0.0.1:1")  # nothing listens there
    try:
        with b.client() as c, pytest.raises(openai.InternalServerError) as err:
            c.chat.completions.create(model="lineage", messages=USER, max_tokens=2)
        assert err.value.status_code == 503 and err.value.body["code"] == "unavailable"
        assert httpx.get(f"{b.url}/health", timeout=10).status_code == 503
    finally:
        b.stop()


def test_the_bridge_reads_the_models_output_format(bridge, engine):
    """The parser family the routes use is the one the engine decided for its model."""
    from clients.client import Client

    with Client(engine.address) as c:
        engine_format = c.model_info()["output_format"]
    assert engine_format == "qwen"  # the embedded model marks <tool_call> and <think>
    from clients.bridge.guard import Caller

    info = bridge.call(bridge.handle.backend.model_info(Caller()))
    assert info["output_format"] == engine_format
