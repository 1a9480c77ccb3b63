"""The three traffics of `bench speculative`: an edit, tool-call JSON, free chat.

Raw prompts (text, tokenized by the bench with the served model's tokenizer)
whose greedy replies are the decode being timed:

- `edit`: a 200-line Python file from the standard library (the embedded
  model's corpus ships with Python) in a user turn that asks for it back with
  a fix, as an agent's edit does (the chat format the embedded model was
  trained to copy in).
- `tool_json`: tool definitions as JSON schemas and earlier tool calls, then
  the start of the next call: keys and paths repeat what is above.
- `tool_schema`: the tool-call JSON prompt, stopped before the calls' list,
  whose reply is held to a JSON schema (an array of calls, each one of the
  tools with its arguments), as a `response_format` json_schema request
  holds it: structured output's decode, constrained rows speculating.
- `chat`: a user turn of prose (the stdlib's own docs) and an open question:
  no file to copy, little for a lookup to find.

Each prompt differs per stream (a different file, a different slice), so
streams of one batch do not copy each other. It knows text, not tokens.
"""

from __future__ import annotations

import inspect
import json

TRAFFICS = ("edit", "tool_json", "chat", "tool_schema")
CALLS = 6  # calls the held reply writes
FILE_LINES = 200
# Standard-library modules whose source the edits re-emit (one per stream, round-robin).
SOURCES = (
    "textwrap",
    "shlex",
    "fnmatch",
    "calendar",
    "bisect",
    "heapq",
    "colorsys",
    "string",
    "glob",
    "tokenize",
)


def _module(name: str):
    import importlib

    return importlib.import_module(name)


def _source_lines(name: str) -> list[str]:
    lines = inspect.getsource(_module(name)).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("import", "from"))), 0)
    return lines[start : start + FILE_LINES]


def _chat(user: str) -> str:
    """A one-turn prompt as the embedded model's chat template renders it, the reply open."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def edit_prompt(stream: int) -> str:
    name = SOURCES[stream % len(SOURCES)]
    text = "\n".join(_source_lines(name)) + "\n"
    return _chat(f"Apply the fix and show the whole file.\n\n# file: {name}.py\n{text}")


TOOLS = [
    {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {arg: {"type": "string"} for arg in args},
            "required": list(args),
        },
    }
    for name, description, args in (
        ("read_file", "Read a file of the repository", ("path",)),
        ("write_file", "Write a file of the repository", ("path", "content")),
        ("run_tests", "Run the tests under a path", ("path", "args")),
        ("search", "Search the repository for a pattern", ("pattern", "path")),
    )
]


def tool_json_prompt(stream: int) -> str:
    return _tool_calls_prompt(stream) + ',\n    {"name": "'


def tool_schema_prompt(stream: int) -> str:
    return _tool_calls_prompt(stream, listed=False)


def _tool_calls_prompt(stream: int, listed: bool = True) -> str:
    """The tools and earlier calls; `listed` false: the earlier calls are `examples`, and
    the prompt ends where a list of calls opens (`calls = `)."""
    names = SOURCES[stream % len(SOURCES) :] + SOURCES[: stream % len(SOURCES)]
    calls = []
    for i, name in enumerate(names * 2):
        tool = TOOLS[i % len(TOOLS)]
        arguments = {
            arg: f"lib/{name}.py" if arg == "path" else name
            for arg in tool["parameters"]["required"]
        }
        calls.append(json.dumps({"name": tool["name"], "arguments": arguments}))
    text = "tools = " + json.dumps(TOOLS, indent=2)
    if listed:
        return text + "\n\ncalls = [\n    " + ",\n    ".join(calls)
    return text + "\n\nexamples = [\n    " + ",\n    ".join(calls) + "\n]\n\ncalls = "


def chat_prompt(stream: int) -> str:
    name = SOURCES[(stream + 3) % len(SOURCES)]
    module = _module(name)
    docs = [inspect.getdoc(module) or ""]
    for member in vars(module).values():
        if callable(member) and getattr(member, "__module__", "") == name and member.__doc__:
            docs.append(inspect.getdoc(member))
    text = "\n\n".join(d for d in docs if d)[:2000]
    return _chat(f"{text}\n\nWhat is the {name} module good for, in your words?")


PROMPTS = {
    "edit": edit_prompt,
    "tool_json": tool_json_prompt,
    "chat": chat_prompt,
    "tool_schema": tool_schema_prompt,
}


def prompt(traffic: str, stream: int) -> str:
    return PROMPTS[traffic](stream)


def calls_schema() -> dict:
    """`tool_schema`'s reply: an array of CALLS calls, each one tool and its arguments."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
                "required": ["name", "arguments"],
            }
            for t in TOOLS
        ]
    }
    return {"type": "array", "items": call, "minItems": CALLS, "maxItems": CALLS}


def schema(traffic: str) -> dict | None:
    """The JSON schema a traffic's replies are held to, or None."""
    return calls_schema() if traffic == "tool_schema" else None
