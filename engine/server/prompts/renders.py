"""The chat template's renders: the client's own, and the ones the engine makes for itself.

Only the render of the client's whole conversation may refuse a request
(`TemplateRenders.render`: InvalidRequest with the template's message). The
engine also renders parts of a conversation for its own analysis: the text
before each message (engine.server.prompts.layout: message starts for message points
and miss explanations), the (system messages + tools) head (the anchor), a
probe of the generation prompt (engine.server.prompts.output_format). Published
templates refuse many of those partial conversations: Qwen's read
`messages[0]` under `{% if tools %}` (an empty conversation raises), Mistral's
and Gemma's `raise_exception` on a conversation that does not start with a
user turn. An analysis render therefore never raises: it answers None, counts
the failure by kind (`failures`, exported as a metric) and logs it once per
template and kind, with the template's error.

`before(kind, head, tools, role)` is the text the template renders before a
message of `role` that follows `head`. The head's own render is exact where the
template accepts it and the prompt starts with it. Where it fails, or where
the template renders the head differently once another message follows (Qwen3
drops the reasoning of assistant turns before the last user turn), the head
is rendered again followed by two placeholder messages of that role that
differ in their first character: their common prefix is everything the
template writes before the placeholder's content, the head as the template
renders it inside a longer conversation plus the message's own header.

It knows the tokenizer's chat template and nothing of tokens or the cache.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Sequence

from jinja2.exceptions import SecurityError

from engine.server.errors import InvalidRequest
from engine.server.prompts import sandbox, variables

log = logging.getLogger(__name__)

# Two placeholder contents that differ at their first character and match no real message's
# start in practice; their common render prefix ends where a message's content begins.
PLACEHOLDERS = ("\u2460lineage-placeholder", "\u2461lineage-placeholder")
ANALYSIS_KINDS = ("layout", "anchor", "probe", "grammar")  # what failed, for the metric


class TemplateRenders:
    """Renders of one tokenizer's chat template (module doc)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.failures: Counter[str] = Counter()  # analysis renders that raised, by kind
        self.placeholders = True  # the fallback on (off: the head's own render alone)
        self._logged: set[tuple[int, str]] = set()
        self._null_content: bool | None = None  # decided on first use (null_content)
        self._own_data = False  # the template changes its own lists: engine.server.prompts.sandbox

    def render(
        self,
        messages: list,
        tools,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        template_kwargs=None,
    ) -> str:
        """The client's conversation as the template writes it; InvalidRequest when the
        template refuses it (its own message). `template_kwargs`: the client's extra
        template variables (the engine's own renders go without them, and keep only
        what agrees with this render)."""
        try:
            return self._render(
                messages, tools, add_generation_prompt, continue_final_message, template_kwargs
            )
        except Exception as e:  # a template error is the request's fault
            raise InvalidRequest(f"the chat template failed on these messages: {e}")

    def analysis(
        self, kind: str, messages: Sequence[dict], tools, add_generation_prompt: bool = False
    ) -> str | None:
        """A render for the engine's own use, or None (counted and logged) when the
        template refuses it."""
        try:
            return self._render(list(messages), tools, add_generation_prompt)
        except Exception as e:
            self.failed(kind, e)
            return None

    def failed(self, kind: str, error: BaseException | str) -> None:
        """Count one analysis failure of `kind`; log the first per template and kind."""
        assert kind in ANALYSIS_KINDS, kind
        self.failures[kind] += 1
        key = (hash(str(self.tokenizer.chat_template)), kind)
        if key not in self._logged:
            self._logged.add(key)
            log.warning(
                "the engine's own %s analysis failed on this model's chat template or "
                "tokenizer; requests are served without it (logged once): %s",
                kind,
                error,
            )

    def before(self, kind: str, head: Sequence[dict], tools, role: str, text: str) -> str | None:
        """What the template writes before a message of `role` following `head`, as far as
        it agrees with the prompt's `text` (module doc); None when nothing renders."""
        errors: list[BaseException] = []
        own = self._quiet(list(head), tools, errors)
        if own is not None and text.startswith(own):
            return own
        shown = self._placeholder_prefix(head, tools, role, errors)
        candidates = [c for c in (own, shown) if c is not None]
        if not candidates:
            self.failed(kind, errors[-1])
            return None
        return max((text[: common_chars(c, text)] for c in candidates), key=len)

    def _placeholder_prefix(self, head, tools, role: str, errors: list) -> str | None:
        if not self.placeholders:
            return None
        for r in dict.fromkeys((role, "user")):  # the message's own role, else a user turn
            a = self._quiet([*head, _placeholder(r, PLACEHOLDERS[0])], tools, errors)
            if a is None:
                continue
            b = self._quiet([*head, _placeholder(r, PLACEHOLDERS[1])], tools, errors)
            if b is not None:
                return a[: common_chars(a, b)]
        return None

    def _quiet(self, messages: list, tools, errors: list) -> str | None:
        """The render without the generation prompt, or None (the error kept in `errors`)."""
        try:
            return self._render(messages, tools, False)
        except Exception as e:
            errors.append(e)
            return None

    def _render(
        self, messages, tools, add_generation_prompt, continue_final_message=False, extra=None
    ):
        """The template's text; its own error when it refuses the messages. Templates
        disagree on a past call's arguments: most read a mapping (`| tojson`), DeepSeek's
        concatenate a JSON string. The engine passes a mapping; a template that refuses it
        gets the same arguments as their JSON text. They disagree on a call turn without
        text too (`null_content`; where None is given and the template refuses it, the
        turn gets "": QwQ's reads an earlier turn's content as a string and its last
        one's not), and on the name of a past turn's reasoning
        (`with_reasoning_names`); a template that refuses a turn's reasoning beside its
        text and calls (gpt-oss) gets the turns without it."""
        args = (tools, add_generation_prompt, continue_final_message, extra)
        tries = []
        for empty in (None, "") if self.null_content() else ("",):
            given = with_call_content(messages, empty)
            named, plain = with_reasoning_names(given), without_reasoning(given)
            tries += [named, with_text_arguments(named)]
            if plain is not None:
                tries += [plain, with_text_arguments(plain)]
        first = None
        for attempt in tries:
            if attempt is None:
                continue
            try:
                return self._apply(attempt, *args)
            except Exception as e:
                if first is None:
                    first = e
        raise first

    def null_content(self) -> bool:
        """Whether an assistant turn with tool calls and no text reaches the template with
        content None (as OpenAI clients send it) rather than "". DeepSeek-R1's template
        writes a turn's calls only where its content is none; Qwen3's reads the content as
        a string and raises on None, others print it as "None". Decided once, by rendering
        a call turn both ways, last and answered by a tool: None where the template takes
        it and prints no "None" in either place."""
        if self._null_content is None:
            call = {
                "id": "call00000",
                "type": "function",
                "function": {"name": "f", "arguments": {}},
            }
            ask = {"role": "user", "content": "hi"}
            answer = {"role": "tool", "tool_call_id": "call00000", "content": "ok"}
            verdicts = []
            for after in ((), (answer,)):
                texts = {}
                for content in (None, ""):
                    texts[content] = None
                    conversation = [
                        ask,
                        {"role": "assistant", "content": content, "tool_calls": [call]},
                        *after,
                    ]
                    for messages in (conversation, with_text_arguments(conversation)):
                        try:
                            texts[content] = self._apply(messages, None, False, False)
                            break
                        except Exception:
                            pass
                text = texts[None]
                if text is not None or texts[""] is not None:  # the template takes this shape
                    verdicts.append(
                        text is not None and ("None" not in text or "None" in (texts[""] or ""))
                    )
            self._null_content = bool(verdicts) and all(verdicts)
        return self._null_content

    def _apply(self, messages, tools, add_generation_prompt, continue_final_message, extra=None):
        """The template's render, with the variables it reads that no request defines
        (engine.server.prompts.variables); where transformers' refuses the template's
        changes to its own lists (Kimi K2's) or a generator given to `tojson` (llama.cpp's
        DeepSeek-R1), engine.server.prompts.sandbox's (decided once)."""
        extra = {**variables.missing(self._template(tools), tools), **(extra or {})}
        args = (messages, tools, add_generation_prompt, continue_final_message, extra)
        if not self._own_data:
            try:
                return self._apply_transformers(*args)
            except (SecurityError, TypeError) as e:
                if not sandbox.needs_own_render(e) or continue_final_message:
                    raise
        text = self._apply_own_data(*args)
        self._own_data = True
        return text

    def _template(self, tools) -> str | None:
        """The template's text (of a named one, tool_use where there are tools)."""
        if hasattr(self.tokenizer, "get_chat_template"):
            try:
                return self.tokenizer.get_chat_template(None, tools or None)
            except ValueError:  # no template at all: the render says so
                return None
        return self.tokenizer.chat_template

    def _apply_own_data(self, messages, tools, add_generation_prompt, continue_final, extra):
        if continue_final:
            raise InvalidRequest(
                "this chat template changes its own lists, which is rendered without "
                "transformers; continuing a final message is not supported there"
            )
        variables = {
            **(getattr(self.tokenizer, "special_tokens_map", None) or {}),
            **(extra or {}),
            "add_generation_prompt": add_generation_prompt,
        }
        if isinstance(getattr(self.tokenizer, "has_thinking", None), bool):
            variables.setdefault("enable_thinking", self.tokenizer.has_thinking)
        template = self._template(tools)
        return sandbox.render(template, list(messages), list(tools) if tools else None, **variables)

    def _apply_transformers(
        self, messages, tools, add_generation_prompt, continue_final_message, extra=None
    ):
        kwargs = {
            **(extra or {}),
            "tokenize": False,
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            kwargs["tools"] = list(tools)
        if continue_final_message:
            kwargs.update(add_generation_prompt=False, continue_final_message=True)
        # Rendered directly where transformers would not: it refuses an empty conversation,
        # and drops a None content (which DeepSeek-R1's template reads: `null_content`).
        if not messages or any(m.get("content", "") is None for m in messages):
            from transformers.utils.chat_template_utils import render_jinja_template

            kwargs.pop("tokenize")
            if isinstance(getattr(self.tokenizer, "has_thinking", None), bool):
                # as mlx-lm's wrapper passes it to every render
                kwargs.setdefault("enable_thinking", self.tokenizer.has_thinking)
            specials = getattr(self.tokenizer, "special_tokens_map", None) or {}
            template = self.tokenizer.chat_template
            if hasattr(self.tokenizer, "get_chat_template"):  # a named one: tool_use with tools
                template = self.tokenizer.get_chat_template(None, kwargs.get("tools"))
            return render_jinja_template(
                conversations=[messages], chat_template=template, **{**specials, **kwargs}
            )[0][0]
        return self.tokenizer.apply_chat_template(messages, **kwargs)


def with_text_arguments(messages: Sequence[dict]) -> list[dict] | None:
    """`messages` with each past call's arguments as JSON text (None: no mapping to turn)."""
    out, changed = [], False
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls:
            turned = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), dict):
                    text = json.dumps(fn["arguments"], ensure_ascii=False)
                    c = {**c, "function": {**fn, "arguments": text}}
                    changed = True
                turned.append(c)
            m = {**m, "tool_calls": turned}
        out.append(m)
    return out if changed else None


# The names published templates read a past assistant turn's reasoning by: most
# `reasoning_content` (Qwen3, GLM, MiniMax, DeepSeek, Gemma 4, ...), gpt-oss and LFM2.5
# `thinking`, Solar, Hy3 and Laguna `reasoning` (Cohere's any of the three). transformers 5
# fills `thinking` itself on its render path, not `reasoning`: the engine names all three.
REASONING_NAMES = ("reasoning_content", "reasoning", "thinking")


def with_reasoning_names(messages: Sequence[dict]) -> list[dict]:
    """`messages` with each turn's `reasoning_content` under every name of REASONING_NAMES
    (a name the message sets itself keeps its value): each template reads its own and
    writes the reasoning in the model's markup, or drops it."""
    out = []
    for m in messages:
        text = m.get("reasoning_content") if isinstance(m, dict) else None
        out.append({**dict.fromkeys(REASONING_NAMES, text), **m} if text else m)
    return out


def without_reasoning(messages: Sequence[dict]) -> list[dict] | None:
    """`messages` without any turn's reasoning (None: none has any)."""
    if not any(isinstance(m, dict) and m.get("reasoning_content") for m in messages):
        return None
    return [
        {k: v for k, v in m.items() if k not in REASONING_NAMES} if isinstance(m, dict) else m
        for m in messages
    ]


def with_call_content(messages: Sequence[dict], empty: str | None) -> list[dict]:
    """`messages` with each assistant turn that has tool calls and no text given content
    `empty` (None or "")."""
    return [
        {**m, "content": empty}
        if isinstance(m, dict)
        and m.get("role") == "assistant"
        and m.get("tool_calls")
        and not m.get("content")
        else m
        for m in messages
    ]


def _placeholder(role: str, content: str) -> dict:
    message = {"role": role, "content": content}
    if role == "tool":
        message["tool_call_id"] = "call00000"  # Mistral's templates want 9 characters
    return message


def common_chars(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (slice compares, in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo
