"""The client's wire format: typed events, results, and proto conversion.

OpenAI-shaped chat messages and tools in, `engine.proto` messages out; proto
events in, frozen dataclasses out. No channels and no calls (clients.client
holds those), and no MLX: a client process imports grpc and the generated code only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

import grpc

from engine.proto import engine_pb2
from engine.runtime.events import Timing  # one definition: the engine's (no MLX behind it)


class InvalidInput(ValueError):
    """A request the caller built wrongly (bad messages, tools, sampling): the caller's
    fault, answered as such (the bridge's 400), unlike any other ValueError."""


DEFAULT_MAX_TOKENS = 256


class LineageError(Exception):
    """A failed call: `code` is the gRPC status name (e.g. "INVALID_ARGUMENT")."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> "LineageError":
        """Wrap a grpc.RpcError (sync or aio) keeping its code name and details."""
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else None
        return cls(code.name if code is not None else "UNKNOWN", details or str(error))


# ---------------------------------------------------------------- events ----


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Restore:
    kind: str = "none"  # entry, guard, final, anchor, divergence, reply, none
    length: int = 0


_JSON_TIMING = (
    "queue_ms",
    "plan_ms",
    "restore_ms",
    "prefill_ms",
    "commit_ms",
    "ttft_ms",
    "decode_tps",
)


@dataclass(frozen=True)
class Progress:
    """Prefill progress of a long prompt: `done` of `total` prompt tokens."""

    done: int
    total: int


@dataclass(frozen=True)
class TokenLogprob:
    """A token, its text (decoded alone) and log-probability; `top`: the most likely tokens
    at its position, most likely first (with a constraint: after the grammar's mask)."""

    token_id: int
    token: str
    logprob: float
    top: tuple["TokenLogprob", ...] = ()


@dataclass(frozen=True)
class Chunk:
    """Newly generated tokens and their text."""

    ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()  # one per id, when asked
    index: int = 0  # its branch (n > 1)


@dataclass(frozen=True)
class Final:
    """The last event of a stream."""

    finish_reason: str  # stop | length | cancelled | error
    usage: Usage
    restore: Restore
    timing: Timing
    request_id: str
    replica: str = ""  # the model replica that served it (with request_id: the trace)
    # A constrained request that ended before its grammar was complete: not valid output
    incomplete: bool = False
    index: int = 0  # the branch it ends (n > 1: a stream ends after n of them)
    stop_sequence: str = ""  # the stop string that ended it ("" when none did)


Event = Union[Progress, Chunk, Final]


@dataclass(frozen=True)
class Result:
    """A whole response: the chunks joined, plus the final event's fields."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    restore: Restore = field(default_factory=Restore)
    timing: Timing = field(default_factory=Timing)
    request_id: str = ""
    replica: str = ""
    incomplete: bool = False  # constrained, and cut before its grammar was complete
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when asked
    # n > 1: every branch's own Result, by index (this one's fields are branch 0's, its
    # usage the request's: the prompt once, every branch's completion tokens)
    choices: tuple["Result", ...] = ()

    def to_json_dict(self) -> dict:
        """The stable JSON shape printed by `lineage generate --json`."""
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "usage": {
                "prompt_tokens": self.usage.prompt_tokens,
                "cached_tokens": self.usage.cached_tokens,
                "completion_tokens": self.usage.completion_tokens,
            },
            "restore": {"kind": self.restore.kind, "length": self.restore.length},
            "timing": {name: getattr(self.timing, name) for name in _JSON_TIMING},
            "request_id": self.request_id,
            "replica": self.replica,
            "incomplete": self.incomplete,
        }


def event_from_proto(event: engine_pb2.GenerateEvent) -> Event:
    """GenerateEvent -> Progress | Chunk | Final. Raises ValueError on an empty event."""
    which = event.WhichOneof("event")
    if which == "progress":
        return Progress(done=event.progress.done, total=event.progress.total)
    if which == "chunk":
        c = event.chunk
        logprobs = tuple(
            TokenLogprob(
                token_id,
                lp.token,
                lp.logprob,
                tuple(
                    TokenLogprob(i, t, v)
                    for i, t, v in zip(lp.top_ids, lp.top_tokens, lp.top_logprobs)
                ),
            )
            for token_id, lp in zip(c.ids, c.logprobs)
        )
        return Chunk(ids=tuple(c.ids), text=c.text, logprobs=logprobs, index=c.index)
    if which == "final":
        f = event.final
        return Final(
            finish_reason=f.finish_reason,
            usage=Usage(f.usage.prompt_tokens, f.usage.cached_tokens, f.usage.completion_tokens),
            restore=Restore(kind=f.restore.kind or "none", length=f.restore.length),
            timing=Timing(
                **{t.name: getattr(f.timing, t.name) for t in dataclasses.fields(Timing)}
            ),
            request_id=f.request_id,
            replica=f.replica,
            incomplete=f.incomplete,
            index=f.index,
            stop_sequence=f.stop_sequence,
        )
    raise ValueError(f"generate event with no payload: {event!r}")


class ResultCollector:
    """Accumulates a stream's events into a Result (one per branch when n > 1)."""

    def __init__(self):
        self.texts: dict[int, list[str]] = {}
        self.ids: dict[int, list[int]] = {}
        self.logprobs: dict[int, list[TokenLogprob]] = {}
        self.finals: dict[int, Final] = {}

    @property
    def final(self) -> Final | None:
        """Branch 0's final event (None before it came)."""
        return self.finals.get(0)

    def add(self, event: Event) -> None:
        if isinstance(event, Chunk):
            self.texts.setdefault(event.index, []).append(event.text)
            self.ids.setdefault(event.index, []).extend(event.ids)
            self.logprobs.setdefault(event.index, []).extend(event.logprobs)
        elif isinstance(event, Final):
            self.finals[event.index] = event

    def _branch(self, index: int, usage: Usage) -> Result:
        f = self.finals[index]
        return Result(
            "".join(self.texts.get(index, ())),
            tuple(self.ids.get(index, ())),
            f.finish_reason,
            usage,
            f.restore,
            f.timing,
            f.request_id,
            f.replica,
            f.incomplete,
            tuple(self.logprobs.get(index, ())),
        )

    def result(self) -> Result:
        if 0 not in self.finals:
            raise LineageError("INTERNAL", "the stream ended without a final event")
        if len(self.finals) == 1:
            return self._branch(0, self.finals[0].usage)
        u = self.finals[0].usage  # the prompt once, every branch's completion
        usage = Usage(
            u.prompt_tokens,
            u.cached_tokens,
            sum(f.usage.completion_tokens for f in self.finals.values()),
        )
        choices = tuple(self._branch(i, self.finals[i].usage) for i in sorted(self.finals))
        return dataclasses.replace(self._branch(0, usage), choices=choices)


# --------------------------------------------------------------- requests ----


def _content_text(content: Any, where: str) -> str:
    """OpenAI content (str, None, or a list of text parts) -> text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise InvalidInput(f"{where}: only text content parts are supported, got {part!r}")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise InvalidInput(f"{where}: content must be a string or a list of text parts")


def tool_call_to_proto(call: Mapping[str, Any], where: str = "tool call") -> engine_pb2.ToolCall:
    """OpenAI {"id", "type": "function", "function": {"name", "arguments"}} -> ToolCall.

    A flat {"id", "name", "arguments"} is accepted too; non-string arguments are
    JSON-encoded.
    """
    if not isinstance(call, Mapping):
        raise InvalidInput(f"{where} must be a dict, got {call!r}")
    fn = call.get("function", call)
    if not isinstance(fn, Mapping) or not fn.get("name"):
        raise InvalidInput(f"{where} has no function name: {call!r}")
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return engine_pb2.ToolCall(id=str(call.get("id") or ""), name=str(fn["name"]), arguments=args)


def message_to_proto(message: Mapping[str, Any], index: int = 0) -> engine_pb2.Message:
    """One {role, content, tool_calls?, tool_call_id?, name?, reasoning_content?} dict ->
    Message. `reasoning_content` (or `reasoning`, vLLM's name: an assistant turn's
    reasoning, as the parsers split it off) goes back to the chat template, which writes
    it in its model's markup or drops it. A Message
    already built (a caller that keeps a conversation's) is taken as it is."""
    if isinstance(message, engine_pb2.Message):
        return message
    where = f"messages[{index}]"
    if not isinstance(message, Mapping) or not message.get("role"):
        raise InvalidInput(f"{where} must be a dict with a role, got {message!r}")
    calls = message.get("tool_calls") or []
    # vLLM's replies name it `reasoning`: a client sends its message back as it came
    field = "reasoning" if message.get("reasoning_content") is None else "reasoning_content"
    reasoning = message.get(field)
    return engine_pb2.Message(
        role=str(message["role"]),
        content=_content_text(message.get("content"), where),
        tool_calls=[tool_call_to_proto(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)],
        tool_call_id=str(message.get("tool_call_id") or ""),
        name=str(message.get("name") or ""),
        reasoning_content=_content_text(reasoning, f"{where}.{field}"),
    )


def tools_to_json(tools: Sequence[Mapping[str, Any]] | None) -> str:
    """A list of tool definitions (OpenAI style) -> tools_json text; None or [] -> ""."""
    if not tools:
        return ""
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
        raise InvalidInput(f"tools must be a list of dicts, got {type(tools).__name__}")
    return json.dumps(list(tools), ensure_ascii=False)


def build_request(
    messages: Sequence[Mapping[str, Any]] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    prompt: str | None = None,
    prompt_ids: Iterable[int] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    top_p: float = 0.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    namespace: str = "",
    request_id: str = "",
    continue_final_message: bool = False,
    session: str = "",
    constraint: Any = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    n: int = 1,
    model: str = "",
    cache_marks: Sequence[int] = (),
    template_kwargs: Mapping[str, Any] | None = None,
) -> engine_pb2.GenerateRequest:
    """Arguments of generate()/stream() -> GenerateRequest.

    Exactly one of messages, prompt, prompt_ids; tools only with messages;
    max_tokens > 0. `session` names the conversation: with several replicas its
    turns go to the one that served it last (scoped by the namespace).
    `constraint` (clients.constraints.Constraint, or a proto Constraint) holds the
    output to a JSON schema, a grammar or a tool choice; `logprobs` asks for each
    token's log-probability, and `top_logprobs` (0-20) for the most likely tokens
    at each position; `n` asks for that many branches from one prefill (their events
    carry `index`); `model` names the model when the server serves several;
    `cache_marks`: indexes of the messages the client marked as places it comes back to
    (their ends become capture points); `template_kwargs`: extra variables for the chat
    template (`enable_thinking`, ...). Raises ValueError naming the bad argument.
    """
    given = [
        n
        for n, v in (("messages", messages), ("prompt", prompt), ("prompt_ids", prompt_ids))
        if v is not None
    ]
    if len(given) != 1:
        got = ", ".join(given) or "none"
        raise InvalidInput(f"give exactly one of messages, prompt, prompt_ids (got {got})")
    if tools and messages is None:
        raise InvalidInput("tools need messages (they are rendered by the chat template)")
    if int(max_tokens) <= 0:
        raise InvalidInput(f"max_tokens must be > 0, got {max_tokens}")
    if isinstance(stop, str):
        stop = [stop]
    sampling = engine_pb2.Sampling(
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=wire_int(top_k, "top_k", 32),
        max_tokens=wire_int(max_tokens, "max_tokens", 32),
        stop=list(stop or []),
        stop_token_ids=[
            wire_int(t, f"stop_token_ids[{i}]", 32) for i, t in enumerate(stop_token_ids or [])
        ],
    )
    if seed is not None:
        sampling.seed = wire_int(seed, "seed", 64)
    if n != 1:
        sampling.n = wire_int(n, "n", 32)
    if logprobs or top_logprobs:
        sampling.logprobs = True
        sampling.top_logprobs = wire_int(top_logprobs or 0, "top_logprobs", 32)
    request = engine_pb2.GenerateRequest(
        request_id=request_id,
        namespace=namespace,
        sampling=sampling,
        session=str(session or ""),
        model=str(model or ""),
    )
    if constraint is not None:
        proto = constraint if isinstance(constraint, engine_pb2.Constraint) else None
        request.constraint.CopyFrom(proto or constraint.to_proto())
    if messages is not None:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidInput("messages must be a list of dicts")
        if not messages:
            raise InvalidInput("messages is empty")
        request.messages.extend(message_to_proto(m, i) for i, m in enumerate(messages))
        request.tools_json = tools_to_json(tools)
        request.add_generation_prompt = not continue_final_message
        request.continue_final_message = continue_final_message
        request.cache_marks.extend(wire_int(k, "cache_marks", 32) for k in cache_marks)
        if template_kwargs:
            if not isinstance(template_kwargs, Mapping):
                raise InvalidInput("chat_template_kwargs must be an object")
            request.template_kwargs_json = json.dumps(dict(template_kwargs), ensure_ascii=False)
    elif prompt is not None:
        request.prompt_text = str(prompt)
    else:
        request.prompt_ids.CopyFrom(engine_pb2.TokenIds(ids=token_ids(prompt_ids)))
    return request


_SESSION = re.compile(r"[A-Za-z0-9._:@+/=-]{1,128}")


def session_key(value: Any) -> str:
    """A client's conversation key (a header, `prompt_cache_key`, `user`, ...) as the wire
    carries it: itself when the engine takes it as an identifier, else a hash of it
    (`h:` and 32 hex digits), so an odd key still routes and never fails the request.
    "" for none."""
    if value is None or value == "":
        return ""
    text = str(value)
    if _SESSION.fullmatch(text):
        return text
    return "h:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def wire_int(value: Any, name: str, bits: int) -> int:
    """An integer the wire's signed `bits`-bit field can carry; else InvalidInput naming it."""
    try:
        v = operator.index(value)  # ints and numpy integers; never floats or strings
    except TypeError:
        raise InvalidInput(f"{name} must be an integer, got {value!r}") from None
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        raise InvalidInput(f"{name} must fit in int{bits}, got {value!r}")
    return v


def token_ids(ids: Iterable[int]) -> list[int]:
    """Token ids as the wire carries them (int32); anything else is InvalidInput naming it."""
    out = []
    for i, t in enumerate(ids):
        try:
            v = operator.index(t)  # ints and numpy integers; never floats or strings
        except TypeError:
            v = -1
        if not 0 <= v < 2**31:
            raise InvalidInput(f"prompt_ids[{i}] must be a token id in [0, 2**31), got {t!r}")
        out.append(v)
    return out


def message_to_dict(message) -> dict:
    """A proto message -> plain dict with every field (ints stay ints, maps become dicts)."""
    out = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.name] = dict(value)
        elif f.is_repeated:
            out[f.name] = [message_to_dict(v) if f.message_type else v for v in value]
        elif f.message_type is not None:
            out[f.name] = message_to_dict(value)
        else:
            out[f.name] = value
    return out
