"""The template corpus (tests/templates) served through the bridge's three wire formats.

For each template of the corpus the random-weight engine's front end is given a prompt
builder whose tokenizer carries that template (the model directory of
`template_model_dir`), and every case goes through chat completions, Anthropic Messages
and Responses on the in-process bridge: tools with a system message and without, no
tools, an earlier assistant turn's tool call (its arguments as an object and as a JSON
string) and its result, reasoning on an earlier assistant turn, two user turns in a row,
and an image part.

What each answer must be comes from the template alone: the conversation as the engine
hands it to the template (its arguments parsed, its reasoning as the wire carries it) is
rendered here with the tokenizer's own `apply_chat_template`. If that render raises, the
request is refused with 400 and the template's own message; if it renders, the request
is answered 200. A render the engine makes for its own analysis (the layout's prefixes,
the anchor's head, the output format's probe) is not the client's: it may never refuse
or fail a request. An image part is refused with 400 by the bridge, naming it.

The Qwen-family templates run twice: with `<tool_call>`/`</tool_call>` as added tokens
(the session's `random_engine`) and as plain text (an engine of its own), as in the
tokenizers of Hermes-style fine-tunes. One test per template and tokenizer sends every
case and lists every case that went wrong: each case on one wire format, a different one
from one template to the next, or on all three in the deep run (`LINEAGE_DEEP_TESTS=1`).
"""

from __future__ import annotations

import contextlib
import copy
import json

import httpx
import pytest

from engine.server.prompts.renders import with_text_arguments
from engine.server.running.background import BackgroundEngine
from tests.clients.bridge.test_bridge import BridgeThread
from tests.deep import deep
from tests.engines import make_config
from tests.templates import FAMILIES, QWEN_TEMPLATES, template_model_dir

SYSTEM = "You are terse."
ASK = "Read the notes file, then say what it holds."
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
    }
]
CALL_ID = "call0notes1"  # 11 characters: Mistral refuses an id shorter than 9
ARGS = {"path": "notes.txt"}
CALL_TURN = {
    "role": "assistant",
    "content": "Let me look.",
    "tool_calls": [
        {"id": CALL_ID, "type": "function", "function": {"name": "read_file", "arguments": ARGS}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": CALL_ID, "content": "milk, eggs"}
REASONED = {"role": "assistant", "content": "Hello.", "reasoning_content": "They greet me."}

# name -> (messages as the engine hands them to the template, tools, the wires that carry it)
WIRES = ("chat", "anthropic", "responses")
CASES = {
    "tools, a system message": (
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
        TOOLS,
        WIRES,
    ),
    "tools, no system message": ([{"role": "user", "content": ASK}], TOOLS, WIRES),
    "no tools, a system message": (
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
        None,
        WIRES,
    ),
    "no tools, no system message": ([{"role": "user", "content": ASK}], None, WIRES),
    "a tool call (arguments an object) and its result": (
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ASK},
            CALL_TURN,
            RESULT,
        ],
        TOOLS,
        WIRES,
    ),
    # Anthropic's tool_use input is always an object: no string form to send.
    "a tool call (arguments a JSON string) and its result": (
        [{"role": "user", "content": ASK}, CALL_TURN, RESULT],
        TOOLS,
        ("chat", "responses"),
    ),
    "reasoning on an earlier assistant turn": (
        [
            {"role": "user", "content": "Hi."},
            REASONED,
            {"role": "user", "content": ASK},
        ],
        TOOLS,
        WIRES,
    ),
    "two user turns in a row": (
        [{"role": "user", "content": "Hi."}, {"role": "user", "content": ASK}],
        None,
        WIRES,
    ),
}
IMAGE = "an image part"
STRING_ARGS = "a tool call (arguments a JSON string) and its result"
PNG = (  # one pixel
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def _arguments(call: dict, as_string: bool):
    args = call["function"]["arguments"]
    return json.dumps(args) if as_string else args


def chat_body(messages, tools, as_string: bool = False) -> dict:
    wire = []
    for m in messages:
        m = copy.deepcopy(m)
        for call in m.get("tool_calls", ()):
            call["function"]["arguments"] = _arguments(call, as_string)
        wire.append(m)
    return {"messages": wire, **({"tools": tools} if tools else {}), "max_tokens": 4}


def anthropic_body(messages, tools) -> dict:
    system = [m["content"] for m in messages if m["role"] == "system"]
    wire = []
    for m in messages:
        if m["role"] == "user":
            wire.append({"role": "user", "content": m["content"]})
        elif m["role"] == "assistant":
            blocks = []
            if m.get("reasoning_content"):
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"]})
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for call in m.get("tool_calls", ()):
                fn = call["function"]
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": fn["name"],
                        "input": fn["arguments"],
                    }
                )
            wire.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"],
                "content": m["content"],
            }
            wire.append({"role": "user", "content": [result]})
    body = {"model": "lineage", "messages": wire, "max_tokens": 4}
    if system:
        body["system"] = "\n\n".join(system)
    if tools:
        body["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in tools
        ]
    return body


def responses_body(messages, tools, as_string: bool = False) -> dict:
    items = []
    for m in messages:
        if m["role"] in ("system", "user"):
            items.append({"type": "message", "role": m["role"], "content": m["content"]})
        elif m["role"] == "assistant":
            if m.get("reasoning_content"):
                text = [{"type": "summary_text", "text": m["reasoning_content"]}]
                items.append({"type": "reasoning", "summary": text})
            if m.get("content"):
                content = [{"type": "output_text", "text": m["content"]}]
                items.append({"type": "message", "role": "assistant", "content": content})
            for call in m.get("tool_calls", ()):
                fn = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": fn["name"],
                        "arguments": _arguments(call, as_string),
                    }
                )
        elif m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
    body = {"model": "lineage", "input": items, "max_output_tokens": 4, "store": False}
    if tools:
        body["tools"] = [{"type": "function", **t["function"]} for t in tools]
    return body


def image_body(wire: str) -> dict:
    """A user turn with an image part, in `wire`'s own shape."""
    if wire == "chat":
        url = {"url": f"data:image/png;base64,{PNG}"}
        parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": url}]
        return chat_body([{"role": "user", "content": parts}], None)
    if wire == "anthropic":
        source = {"type": "base64", "media_type": "image/png", "data": PNG}
        blocks = [{"type": "text", "text": "What is this?"}, {"type": "image", "source": source}]
        return anthropic_body([{"role": "user", "content": blocks}], None)
    parts = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
    ]
    return responses_body([{"role": "user", "content": parts}], None)


def engine_messages(messages, wire: str) -> list[dict]:
    """The messages as the engine hands them to the template from `wire`: every wire
    carries an earlier turn's reasoning as its `reasoning_content`."""
    return copy.deepcopy(messages)


PATHS = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}


def requests_of(case: str, wire: str):
    """(body, messages as the engine hands them to the template, tools) of one case on
    one wire."""
    messages, tools, _ = CASES[case]
    if wire == "chat":
        body = chat_body(messages, tools, as_string=case == STRING_ARGS)
    elif wire == "anthropic":
        body = anthropic_body(messages, tools)
    else:
        body = responses_body(messages, tools, as_string=case == STRING_ARGS)
    return body, engine_messages(messages, wire), tools


def own_render_error(tokenizer, messages, tools) -> str | None:
    """The template's message where it refuses the client's conversation itself: with a
    past call's arguments as a mapping, and (the engine's second try, for templates that
    concatenate them) as their JSON text."""
    kwargs = {"tools": tools} if tools else {}
    error = None
    for attempt in (messages, with_text_arguments(messages)):
        if attempt is None:
            continue
        try:
            tokenizer.apply_chat_template(
                attempt, tokenize=False, add_generation_prompt=True, **kwargs
            )
            return None
        except Exception as e:
            error = error or str(e)
    return error


def error_message(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"]["message"])
    except Exception:
        return reply.text[:300]


def verdicts(url: str, builder, namespace: str, turn: int) -> list[str]:
    """Every case on its wires; a line for each answer that is not what the template says.

    The deep run (`LINEAGE_DEEP_TESTS=1`) sends every case on every wire it goes on.
    Otherwise each case goes on one of them, the next one for each `turn` (the template's
    place in the corpus): every template still meets every case, and every case every
    wire, across the corpus."""
    wrong = []
    headers = {"x-cache-namespace": namespace, "x-api-key": "unused"}
    with httpx.Client(base_url=url, timeout=120, headers=headers) as http:
        for i, (case, (_, _, wires)) in enumerate(CASES.items()):
            if not deep():
                wires = (wires[(turn + i) % len(wires)],)
            for wire in wires:
                body, messages, tools = requests_of(case, wire)
                reply = http.post(PATHS[wire], json=body)
                refusal = own_render_error(builder.tokenizer, messages, tools)
                got = (
                    f"{reply.status_code} {error_message(reply)!r}"
                    if reply.status_code != 200
                    else "200"
                )
                if refusal is None and reply.status_code != 200:
                    wrong.append(f"{wire} | {case}: want 200, got {got}")
                elif refusal is not None and not (
                    reply.status_code == 400 and refusal in error_message(reply)
                ):
                    wrong.append(f"{wire} | {case}: want 400 {refusal!r}, got {got}")
        for wire in WIRES:
            reply = http.post(PATHS[wire], json=image_body(wire))
            message = error_message(reply)
            if reply.status_code != 400 or "image" not in message:
                wrong.append(
                    f"{wire} | {IMAGE}: want 400 naming the image, got "
                    f"{reply.status_code} {message!r}"
                )
    return wrong


@contextlib.contextmanager
def serving_template(engine: BackgroundEngine, model_dir):
    """The engine's front end renders with the tokenizer (template included) of
    `model_dir`, built as `lineage serve` builds it; the engine's own afterwards."""
    from mlx_lm.utils import load_tokenizer

    from engine.server.prompts.prompt import PromptBuilder

    frontend = engine.engine.frontend
    config = engine.config
    own = frontend.builder
    frontend.builder = PromptBuilder(
        load_tokenizer(model_dir),
        frontend.info.vocab_size,
        frontend.info.max_context,
        config.cache.anchor_slack,
        limits=config.limits,
        prompt=config.prompt,
    )
    try:
        yield frontend.builder
    finally:
        frontend.builder = own


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("template-corpus")


@pytest.fixture(scope="module")
def special_bridge(random_engine):
    b = BridgeThread(random_engine, in_process=True)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def plain_engine(ray_session, corpus_dir, random_model_dir):
    """An engine whose tokenizer holds `<tool_call>`/`</tool_call>` as plain text."""
    model = template_model_dir(
        corpus_dir, "qwen3", special_tool_tokens=False, weights=random_model_dir
    )
    e = BackgroundEngine(make_config(corpus_dir / "plain-cache", model=model))
    b = BridgeThread(e, in_process=True)
    yield e, b
    b.stop()
    e.stop()


@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_every_case_is_answered_or_refused_by_the_template_itself(
    template, random_engine, special_bridge, corpus_dir, random_model_dir
):
    model = template_model_dir(corpus_dir, template, True, weights=random_model_dir)
    turn = sorted(FAMILIES).index(template)
    with serving_template(random_engine, model) as builder:
        wrong = verdicts(special_bridge.url, builder, f"corpus-{template}", turn)
    assert not wrong, f"{template} ({FAMILIES[template][0]}):\n" + "\n".join(wrong)


@pytest.mark.parametrize("template", QWEN_TEMPLATES)
def test_tool_markup_as_plain_text_is_answered_too(
    template, plain_engine, corpus_dir, random_model_dir
):
    engine, bridge = plain_engine
    model = template_model_dir(corpus_dir, template, False, weights=random_model_dir)
    with serving_template(engine, model) as builder:
        assert "<tool_call>" not in builder.tokenizer.get_vocab()
        turn = QWEN_TEMPLATES.index(template)
        wrong = verdicts(bridge.url, builder, f"corpus-plain-{template}", turn)
    assert not wrong, f"{template}, <tool_call> as text:\n" + "\n".join(wrong)


def _chat(http, engine, messages) -> tuple[dict, object]:
    """(the reply, the engine's record of it) of one chat request in namespace `warm`."""
    body = {**chat_body(messages, TOOLS), "max_tokens": 8, "temperature": 0}
    reply = http.post(PATHS["chat"], json=body, headers={"x-cache-namespace": "warm"})
    assert reply.status_code == 200, error_message(reply)
    return reply.json(), engine.engine.frontend.activity.records[-1]


def test_a_warm_turn_restores_on_a_template_that_refuses_the_engines_own_renders(
    plain_engine, corpus_dir, random_model_dir
):
    """Qwen3-Next's template refuses the engine's head render (no user turn) and its
    empty render (messages[0] under tools), and the tokenizer spells <tool_call> as text:
    a sub-agent on the same system prompt and tools restores the anchor the placeholder
    fallback found, and a second turn restores the first turn's prompt."""
    engine, bridge = plain_engine
    model = template_model_dir(corpus_dir, "qwen3_next", False, weights=random_model_dir)
    system = {"role": "system", "content": SYSTEM + " " + "Keep answers short. " * 40}
    with serving_template(engine, model) as builder:
        with httpx.Client(base_url=bridge.url, timeout=120) as http:
            first = [system, {"role": "user", "content": ASK}]
            reply, one = _chat(http, engine, first)
            said = {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}
            _, two = _chat(http, engine, [*first, said, {"role": "user", "content": "Go on."}])
            _, three = _chat(http, engine, [system, {"role": "user", "content": "Another."}])
        assert builder.renders.failures["anchor"] == 0  # the fallback found it
    assert one.restore_kind == "none"
    # Qwen3-Next's template writes a past reply differently from the model's own tokens (its
    # empty reasoning block), so turn two restores at the first prompt's end or its guard.
    assert two.restore_kind != "none" and two.cached_tokens >= one.prompt_tokens - 16 - 64
    assert three.restore_kind == "anchor" and three.cached_tokens > 0
