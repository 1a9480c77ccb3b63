"""A Generate request's proto, read into the domain: its checks, its prompt, its sampling.

`check_request` runs every check of a request's values (engine.server.security.limits),
`to_prompt_input` builds its PromptInput (messages, tools, marks, the client's chat
template variables) and `to_sampling` its SamplingParams; a bad value raises
InvalidRequest naming it. It knows the proto's request messages and the limits; nothing
of the servicer, the front end or how a prompt is rendered.
"""

from __future__ import annotations

from engine.proto import engine_pb2
from engine.runtime.requests import SamplingParams
from engine.server.errors import InvalidRequest
from engine.server.prompts.prompt import PromptInput, parse_tools
from engine.server.security.limits import (
    DEFAULT_LIMITS,
    check_identifier,
    check_request_bytes,
    check_sampling,
    parse_json,
    printable,
)


def check_request(
    req: engine_pb2.GenerateRequest,
    sampling: SamplingParams,
    vocab_size: int,
    limits=DEFAULT_LIMITS,
) -> None:
    """Every check of a Generate request's values, in one place (engine.server.security.limits): its
    size, its identifiers, its sampling. What depends on the prompt (its length against
    the context and the batch) is the front end's, once the prompt is built."""
    check_request_bytes(req.ByteSize(), limits)
    check_identifier("request_id", req.request_id, limits)
    check_identifier("namespace", req.namespace, limits)
    check_identifier("session", req.session, limits)
    check_sampling(sampling, vocab_size, limits)


def to_prompt_input(req: engine_pb2.GenerateRequest, limits=DEFAULT_LIMITS) -> PromptInput:
    """The request's prompt, in domain terms. Raises InvalidRequest."""
    sources = [bool(req.messages), req.HasField("prompt_ids"), bool(req.prompt_text)]
    if sum(sources) > 1:
        raise InvalidRequest("give exactly one of messages, prompt_ids, prompt_text")
    if req.HasField("prompt_ids"):
        return PromptInput(prompt_ids=tuple(req.prompt_ids.ids))
    if req.prompt_text:
        return PromptInput(prompt_text=req.prompt_text)
    messages = tuple(_message(m) for m in req.messages)
    return PromptInput(
        messages=messages,
        tools=parse_tools(req.tools_json, limits),
        # Unset means true: a chat request asks for the assistant's turn by default.
        add_generation_prompt=(
            req.add_generation_prompt if req.HasField("add_generation_prompt") else True
        ),
        continue_final_message=req.continue_final_message,
        marks=_marks(req.cache_marks, len(messages)),
        template_kwargs=_template_kwargs(req.template_kwargs_json, limits),
    )


# What the render itself passes: a client's template variable may not replace it.
RENDER_OWN = ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message")


def _template_kwargs(text: str, limits) -> dict | None:
    """The client's extra chat template variables; InvalidRequest names a bad one."""
    if not text:
        return None
    value = parse_json("chat_template_kwargs", text, limits)
    if not isinstance(value, dict):
        raise InvalidRequest("chat_template_kwargs must be a JSON object")
    for key in value:
        if key in RENDER_OWN or not key.isidentifier():
            raise InvalidRequest(f"chat_template_kwargs: {printable(key)!r} cannot be set")
    return value


def _marks(marks, n: int) -> tuple[int, ...]:
    """The marked message indexes; InvalidRequest names one outside the messages."""
    for k in marks:
        if not 0 <= k < n:
            raise InvalidRequest(f"cache_marks: {k} is not a message index (0..{n - 1})")
    return tuple(sorted(set(marks)))


def _message(m: engine_pb2.Message) -> dict:
    out = {"role": m.role, "content": m.content}
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            where = f"tool call {printable(c.name)}: arguments"
            args = parse_json(where, c.arguments) if c.arguments else {}
            calls.append(
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}}
            )
        out["tool_calls"] = calls
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    if m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content
    return out


def to_sampling(s: engine_pb2.Sampling) -> SamplingParams:
    return SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        seed=s.seed if s.HasField("seed") else None,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        logprobs=s.logprobs or s.top_logprobs > 0,
        top_logprobs=s.top_logprobs,
        n=s.n or 1,
    )
