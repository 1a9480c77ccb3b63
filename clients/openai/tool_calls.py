"""Tool calls in the model's own text: `<tool_call>\n{json}\n</tool_call>` blocks.

The format the embedded chat template renders (and mlx-lm's json_tools parser
reads), turned into OpenAI tool calls, whole or while text streams. Plain
Python; importing mlx-lm's parser would load MLX into a client process.
"""

import json
import re
import uuid

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
# One block; an unterminated last block counts when its JSON is whole (EOS or
# max_tokens right after the closing brace).
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _tool_call(body: str) -> dict | None:
    """One block's JSON {"name", "arguments"} -> an OpenAI tool call; None if malformed."""
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": args},
    }


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """Model text -> (content, tool calls) for `<tool_call>\\n{json}\\n</tool_call>` blocks.

    The format the embedded chat template renders (mlx-lm's json_tools parser:
    the same markers, a JSON body). Content is the text outside the blocks,
    stripped. If any block is malformed, no calls are returned and the content is
    the text unchanged, so nothing the model wrote is lost.
    """
    if TOOL_CALL_START not in text:
        return text, []
    calls = [_tool_call(m.group(1)) for m in _TOOL_CALL_BLOCK.finditer(text)]
    if not calls or None in calls:
        return text, []
    return _TOOL_CALL_BLOCK.sub("", text).strip(), calls


def _partial_start(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of TOOL_CALL_START."""
    for k in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_CALL_START[:k]):
            return k
    return 0


class ToolCallStream:
    """Streamed text -> content to send now, with tool calls parsed at the end.

    Content streams as it comes, except a tail that may be the start of
    `<tool_call>`; from the first block on, text is held and parsed by finish().
    Invariant: the pieces feed() returned plus finish()'s content, when finish()
    finds no calls, are the text fed.
    """

    def __init__(self):
        self._held = ""
        self._calls_text: str | None = None

    def feed(self, text: str) -> str:
        if self._calls_text is not None:
            self._calls_text += text
            return ""
        text = self._held + text
        at = text.find(TOOL_CALL_START)
        if at >= 0:
            self._held, self._calls_text = "", text[at:]
            return text[:at]
        keep = _partial_start(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet sent, tool calls)."""
        if self._calls_text is None:
            return self._held, []
        content, calls = parse_tool_calls(self._calls_text)
        return (content, calls) if calls else (self._calls_text, [])
