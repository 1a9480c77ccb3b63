"""JSON and Python literals in a model's output, read without ever raising.

Model output is untrusted text: reading a value out of it answers the value, or the
caller's `default` (the caller then keeps the markup as text), never an exception.
A value comes back only when the wire can carry it:

- nesting at most MAX_JSON_DEPTH (JSON) or PYTHON_DEPTH (Python), measured on the
  text before any parser recurses into it (`json_depth`, the measure of
  engine.server.security.limits.text_depth, which this module does not import: that
  brings Ray into every client). A parser stopped by Python's recursion limit leaves
  its thread at that limit, where every finalizer the collector runs fails;
- no NaN or Infinity (JSON's wire has none), integers within Python's int-string
  limit, strings of valid Unicode (a lone surrogate escape cannot be encoded for the
  wire), and for Python literals only what JSON holds (no sets, bytes, complex);
- Python text is parsed only when it is shaped like literals and calls: no comments,
  f-strings, keywords or operator and trailer chains, whose parse recurses (or runs
  out of memory) in the compiler however shallow their brackets are.

It knows JSON and Python's literal syntax; it knows no family's markup.
Plain Python, no MLX, no numpy.
"""

from __future__ import annotations

import ast
import json
import re

from engine.config import MAX_JSON_DEPTH

PYTHON_DEPTH = 100  # below the tokenizer's own 200, with the evaluators' frames to spare
PYTHON_SEGMENT = 64  # tokens between two separators: any literal has a handful
_DECODER = json.JSONDecoder()
UNREAD = object()  # a default that no value read can be (JSON's null is None)

# A JSON string (escapes included; its brackets are text) or a bracket.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)
# A Python string with its prefix, terminated as the tokenizer terminates it.
_PY_STRING = re.compile(
    r"([A-Za-z]{0,2})("
    r"'''(?:[^'\\]|\\.|'(?!''))*'''"
    r'|"""(?:[^"\\]|\\.|"(?!""))*"""'
    r"|'(?:[^'\\\n]|\\.)*'"
    r'|"(?:[^"\\\n]|\\.)*")',
    re.S,
)
# Outside strings: what no literal holds (a comment, a keyword of an expression) and a
# trailer after a closed bracket or string (`f()()`, `x[0][0]`, `'a'.b`), chains whose
# parse recurses once per link.
_PY_REFUSED = re.compile(
    r"#|\b(?:lambda|not|and|or|if|else|for|in|is|await|yield|async)\b|[)\]}\x00]\s*[(\[.]"
)
_PY_SEPARATOR = re.compile(r"[,:()\[\]{}]|(?<![=!<>])=(?!=)")
_PY_TOKEN = re.compile(r"\w+|[^\w\s]")


def json_depth(text: str, at: int = 0, most: int = MAX_JSON_DEPTH) -> int:
    """The deepest nesting of brackets and braces in JSON text from `at`, outside its
    strings, counted without parsing; the count stops once it passes `most`."""
    depth = deepest = 0
    for m in _JSON_TOKENS.finditer(text, at):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > most:
                    break
        elif c in "]}":
            depth -= 1
    return deepest


def _shallow(text: str) -> bool:
    if "[" not in text and "{" not in text:
        return True
    return json_depth(text) <= MAX_JSON_DEPTH


def carried(value) -> bool:
    """Whether the wire can carry `value` as JSON: JSON's types only (tuples as lists),
    finite numbers, integers it can write, valid Unicode."""
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return False
    return True


def json_value(text: str, default=None):
    """The JSON value `text` holds (whitespace around it allowed), else `default`."""
    if not _shallow(text):
        return default
    try:
        value = json.loads(text)
    except ValueError:  # JSONDecodeError, and an integer past the int-string limit
        return default
    return value if carried(value) else default


def json_at(text: str, at: int) -> tuple[object, int] | None:
    """The JSON value that starts at `at` and the index after it, else None."""
    if text.startswith(("[", "{"), at) and json_depth(text, at) > MAX_JSON_DEPTH:
        return None
    try:
        value, end = _DECODER.raw_decode(text, at)
    except ValueError:
        return None
    return (value, end) if carried(value) else None


def python_tree(text: str) -> ast.expr | None:
    """`text` (leading spaces and tabs dropped, as ast.literal_eval drops them) parsed as
    one Python expression, when it is shaped like literals and calls; else None."""
    text = text.lstrip(" \t")
    strings, bare, at = [], [], 0
    for m in _PY_STRING.finditer(text):
        if "f" in m.group(1).lower():
            return None  # an f-string's fields are expressions, parsed as code
        bare.append(text[at : m.start()])
        bare.append("\x00")  # a string: one token, never a name
        strings.append(m.group(2))
        at = m.end()
    bare.append(text[at:])
    code = "".join(bare)
    if _PY_REFUSED.search(code) or _python_depth(code) > PYTHON_DEPTH:
        return None
    if any(len(_PY_TOKEN.findall(s)) > PYTHON_SEGMENT for s in _PY_SEPARATOR.split(code)):
        return None
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError):  # ValueError: a null byte, a digit limit
        return None


def _python_depth(code: str) -> int:
    depth = deepest = 0
    for c in code:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth -= 1
    return deepest


def python_value(node: ast.AST | None, read=ast.literal_eval, default=None):
    """`read(node)` (ast.literal_eval, or a reader of the same contract) of a node of
    python_tree's, when it is a value the wire can carry; else `default`."""
    if node is None:
        return default
    try:
        value = read(node)
    except (ValueError, TypeError, SyntaxError, MemoryError):
        return default
    return value if carried(value) else default


def python_literal_text(text: str, default=None, read=ast.literal_eval):
    """The Python literal `text` holds (ast.literal_eval's reading), else `default`."""
    return python_value(python_tree(text), read, default)
