"""Limits on every field a client sends, checked before any work is done.

The checks that apply one table of limits (`engine.config.Limits`, operator
settings: a flag and a variable each, refused at startup when nonsensical). A value out of bounds
raises InvalidRequest naming the field and the limit, so the servicer answers
INVALID_ARGUMENT and the engine keeps serving everyone else. It knows the
request's fields as plain Python values; it knows no gRPC, tokenizer or model.

Why these numbers: a stop string is matched against the decoded tail of every
token of every request in the batch, so 100k short stops cost more per token
than the decode step itself; 16 stops of 256 characters cost nothing
measurable. Identifiers travel into logs and cache files, so they are short and
plain. JSON nesting is bounded so neither the parser nor the chat template
recurses without bound, and it is measured on the text before the parser
sees it (`text_depth`): a parser stopped by Python's recursion limit leaves the
thread at that limit, where any finalizer the garbage collector runs fails.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from engine.config import Limits
from engine.server.errors import InvalidRequest

# request_id and namespace: letters, digits and . _ : @ + / = - (no spaces,
# no control characters), so they are safe in a log line and a file header.
_IDENT = re.compile(r"[A-Za-z0-9._:@+/=-]*")
# A JSON string (escapes included): its brackets are text, not nesting.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit (engine.runtime.logprobs reads them)
SEED_LIMIT = 1 << 63  # seeds are int64 on the wire; MLX keys take non-negative ones


DEFAULT_LIMITS = Limits()
__all__ = ["DEFAULT_LIMITS", "Limits"]


def printable(text: str, most: int = 64) -> str:
    """A client-given string made safe for a log line or an error message."""
    s = "".join(c if c.isprintable() else "?" for c in str(text)[:most])
    return repr(s + ("..." if len(text) > most else ""))


def check_identifier(name: str, value: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """request_id / namespace: at most `max_id_length` characters of a plain charset."""
    if len(value) > limits.max_id_length:
        raise InvalidRequest(
            f"{name} has {len(value)} characters; the limit is {limits.max_id_length}"
        )
    if not _IDENT.fullmatch(value):
        raise InvalidRequest(
            f"{name} {printable(value)} has characters outside letters, digits and ._:@+/=-"
        )


def check_sampling(s, vocab_size: int, limits: Limits = DEFAULT_LIMITS) -> None:
    """Every sampling value finite and in range; stops within the limits."""
    if s.max_tokens <= 0:
        raise InvalidRequest(f"max_tokens must be > 0, got {s.max_tokens}")
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise InvalidRequest(f"temperature must be a finite number >= 0, got {s.temperature}")
    if not (math.isfinite(s.top_p) and 0 <= s.top_p <= 1):
        raise InvalidRequest(f"top_p must be in [0, 1], got {s.top_p}")
    if s.top_k < 0:
        raise InvalidRequest(f"top_k must be >= 0, got {s.top_k}")
    if s.seed is not None and not 0 <= s.seed < SEED_LIMIT:
        raise InvalidRequest(f"seed must be in [0, 2^63), got {s.seed}")
    if len(s.stop) > limits.max_stop_strings:
        raise InvalidRequest(f"{len(s.stop)} stop strings; the limit is {limits.max_stop_strings}")
    for i, stop in enumerate(s.stop):
        if len(stop) > limits.max_stop_length:
            raise InvalidRequest(
                f"stop[{i}] has {len(stop)} characters; the limit is {limits.max_stop_length}"
            )
    if len(s.stop_token_ids) > limits.max_stop_token_ids:
        raise InvalidRequest(
            f"{len(s.stop_token_ids)} stop token ids; the limit is {limits.max_stop_token_ids}"
        )
    if not 1 <= s.n <= limits.max_n:
        raise InvalidRequest(f"n must be in [1, {limits.max_n}] (--max-n), got {s.n}")
    if not 0 <= s.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {s.top_logprobs}"
        )
    bad = [t for t in s.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequest(f"stop token id {bad[0]} is outside the vocabulary [0, {vocab_size})")


def check_request_bytes(nbytes: int, limits: Limits = DEFAULT_LIMITS) -> None:
    if nbytes > limits.max_request_bytes:
        raise InvalidRequest(
            f"the request has {nbytes} bytes; the limit is {limits.max_request_bytes}"
        )


def parse_json(what: str, text: str, limits: Limits = DEFAULT_LIMITS):
    """JSON text parsed with its nesting depth bounded; InvalidRequest names what is wrong."""
    depth = text_depth(text)
    if depth > limits.max_json_depth:  # refused before the parser recurses that deep
        raise InvalidRequest(
            f"{what} nests {depth} levels deep; the limit is {limits.max_json_depth}"
        )
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"{what} is not valid JSON: {e}")
    depth = json_depth(value)
    if depth > limits.max_json_depth:
        raise InvalidRequest(
            f"{what} nests {depth} levels deep; the limit is {limits.max_json_depth}"
        )
    return value


def text_depth(text: str | bytes) -> int:
    """The deepest nesting of brackets and braces in JSON text, outside its strings, counted
    without parsing (no recursion; a pass of numpy over the bytes)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if b"[" not in data and b"{" not in data:
        return 0
    codes = np.frombuffer(_JSON_STRING.sub(b'""', data), np.uint8)
    step = np.zeros(codes.shape, np.int32)
    step[(codes == ord("[")) | (codes == ord("{"))] = 1
    step[(codes == ord("]")) | (codes == ord("}"))] = -1
    return int(np.cumsum(step).max(initial=0))


def json_depth(value) -> int:
    """The deepest nesting of lists and objects in a parsed JSON value (no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in node)
    return deepest
