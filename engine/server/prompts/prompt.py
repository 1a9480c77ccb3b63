"""Prompts from requests: validation, volatile lines, the chat template, the anchor boundary.

Before the template renders a chat request, the volatile-line rules remove the
lines of its system messages that change on every request (engine.server.prompts.volatile),
and `Prompt.volatile` counts them for the request's log line.

The anchor is where (system messages + tools) ends and the first user message
begins: what the chat template writes before the first message after the
leading system messages (engine.server.prompts.renders `before`: their render with the
tools, or where the template refuses that, the part a placeholder message does
not change), tokenized once per distinct text (memoized), and its common prefix
with the prompt, minus a few tokens of slack for BPE merges at the boundary
(docs/architecture.md, "The cache contract"). Only the render of the client's
whole conversation may refuse a request; the engine's own renders (anchor,
layout, output-format probe) degrade to no analysis (engine.server.prompts.renders).

`Prompt.layout` says where each message starts in the tokens and what each said
(engine.server.prompts.layout), for the cache manager's miss explanations. The model's
output format (ModelInfo.output_format) is decided here at load, from the same
template and tokenizer (engine.server.prompts.output_format). The tokenizer's word
cache is held small and emptied now and then (engine.server.prompts.word_cache).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from engine.cache.messages import PromptLayout
from engine.config import PromptConfig
from engine.runtime.structured.markup import token_markers
from engine.server.errors import InvalidRequest
from engine.server.prompts.constraints import GrammarCheck
from engine.server.prompts.layout import Layouts, encode_with_offsets
from engine.server.prompts.output_format import output_format
from engine.server.prompts.renders import TemplateRenders
from engine.server.prompts.volatile import VolatileLines
from engine.server.prompts.word_cache import WordCache
from engine.server.security.limits import DEFAULT_LIMITS, Limits, parse_json, printable

MESSAGE_ROLES = ("system", "user", "assistant", "tool")  # roles of chat messages


@dataclass(frozen=True)
class PromptInput:
    """What a request asks to run, before tokenization."""

    messages: tuple[dict, ...] = ()
    tools: tuple[dict, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    marks: tuple[int, ...] = ()  # messages the client marked to come back to (cache_control)
    template_kwargs: Mapping | None = None  # extra chat template variables (enable_thinking)


@dataclass(frozen=True)
class Prompt:
    tokens: tuple[int, ...]
    anchor_len: int
    layout: PromptLayout = PromptLayout()  # empty for raw tokens or text
    volatile: int = 0  # system-prompt lines the volatile-line rules removed


def parse_tools(tools_json: str, limits: Limits = DEFAULT_LIMITS) -> tuple[dict, ...] | None:
    """The tools list from its JSON text; InvalidRequest names what is malformed."""
    if not tools_json.strip():
        return None
    if len(tools_json) > limits.max_tools_bytes:
        raise InvalidRequest(
            f"tools_json has {len(tools_json)} characters; the limit is {limits.max_tools_bytes}"
        )
    tools = parse_json("tools_json", tools_json, limits)
    if not isinstance(tools, list):
        raise InvalidRequest("tools_json must be a JSON list of tool definitions")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidRequest(f"tools[{i}] must be an object, got {type(tool).__name__}")
        fn = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if fn is None:
            raise InvalidRequest(f"tools[{i}].type must be 'function', got {tool.get('type')!r}")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(f"tools[{i}] has no function name")
        params = fn.get("parameters", {})
        if not isinstance(params, dict):
            raise InvalidRequest(f"tools[{i}].function.parameters must be an object")
    return tuple(tools)


# Anchor renders remembered: one per system block and tools in use (an assistant, a coding
# agent, its sub-agents' prompts), each its text and ids, up to ~100 KiB for an agent's
# tools. (It was 256: several MiB that filled over the first 20 minutes of a soak.)
ANCHOR_MEMO_ENTRIES = 64


class PromptBuilder:
    """Turns a PromptInput into prompt tokens plus the anchor length."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        max_context: int,
        anchor_slack: int = 2,
        memo_size: int = ANCHOR_MEMO_ENTRIES,
        limits: Limits = DEFAULT_LIMITS,
        prompt: PromptConfig | None = None,
    ):
        prompt = prompt or PromptConfig()
        self.tokenizer = tokenizer
        self.word_cache = WordCache(tokenizer)  # its BPE's words: a few hundred KiB
        self.limits = limits
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.anchor_slack = anchor_slack
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._memo_size = memo_size
        self._memo_bytes = limits.max_memo_bytes  # text plus ids, over every memoized render
        self.memo_nbytes = 0
        self.volatile = VolatileLines(prompt.volatile_lines)
        self.renders = TemplateRenders(tokenizer)
        self.layouts = Layouts(
            lambda head, tools, role, text: self.renders.before("layout", head, tools, role, text)
        )
        self.output_format = output_format(
            prompt.output_format,
            tokenizer,
            lambda messages: self.renders.analysis("probe", messages, None, True),
        )
        # Markup the tool and reasoning grammars match as one token, not as text.
        self.special_markers = token_markers(tokenizer)
        self.grammars = GrammarCheck(tokenizer, vocab_size, self.renders.failed)

    def build(self, inp: PromptInput) -> Prompt:
        self.word_cache.tick()
        layout, volatile = PromptLayout(), 0
        if inp.prompt_ids is not None:
            tokens = tuple(int(t) for t in inp.prompt_ids)
            bad = [t for t in tokens if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequest(
                    f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
                )
            anchor = 0
        elif inp.prompt_text is not None:
            tokens = tuple(self.tokenizer.encode(inp.prompt_text, add_special_tokens=False))
            anchor = 0
        else:
            self._check_messages(inp.messages, self.limits)
            messages, volatile = self.volatile.apply(inp.messages)
            text = self.render(
                list(messages),
                inp.tools,
                inp.add_generation_prompt,
                inp.continue_final_message,
                inp.template_kwargs,
            )
            tokens, starts = encode_with_offsets(self.tokenizer, text)
            anchor = self.anchor_length(messages, inp.tools, tokens, text)
            layout = self.layouts.layout(messages, inp.tools, text, starts, tokens)
            if inp.marks and layout.starts:
                layout = replace(layout, marks=inp.marks)
        if not tokens:
            raise InvalidRequest("the prompt is empty")
        if len(tokens) >= self.max_context:
            raise InvalidRequest(
                f"the prompt has {len(tokens)} tokens; the model's context is {self.max_context}"
            )
        return Prompt(tokens=tokens, anchor_len=anchor, layout=layout, volatile=volatile)

    def render(
        self,
        messages: list,
        tools,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        template_kwargs: Mapping | None = None,
    ) -> str:
        """The client's conversation as the template writes it; InvalidRequest when the
        template refuses it."""
        return self.renders.render(
            messages, tools, add_generation_prompt, continue_final_message, template_kwargs
        )

    def anchor_length(self, messages, tools, tokens, text: str) -> int:
        """Tokens the prompt shares with what the template writes before the first message
        after its system messages (with the tools); 0 where the template renders nothing."""
        head = []
        for m in messages:
            if m.get("role") != "system":
                break
            head.append(m)
        if not head and not tools:
            return 0
        if len(head) == len(messages) and not tools:
            return 0  # nothing after the system block: no boundary to pin
        role = str(messages[len(head)].get("role", "user")) if len(head) < len(messages) else "user"
        shown = self.renders.before("anchor", head, tools, role, text)
        if not shown:
            return 0
        prefix = self._tokens(shown)
        prompt = np.asarray(tokens, dtype=np.int64)
        n = min(len(prefix), len(prompt))
        mismatch = np.nonzero(prefix[:n] != prompt[:n])[0]
        common = int(mismatch[0]) if mismatch.size else n
        return max(0, common - self.anchor_slack)

    def _tokens(self, text: str) -> np.ndarray:
        hit = self._memo.get(text)
        if hit is not None:
            self._memo.move_to_end(text)
            return hit
        ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
        cost = _memo_cost(text, ids)
        if cost > self._memo_bytes:
            return ids  # too big to keep: it would evict every other anchor
        self._memo[text] = ids
        self.memo_nbytes += cost
        while len(self._memo) > self._memo_size or self.memo_nbytes > self._memo_bytes:
            old, old_ids = self._memo.popitem(last=False)
            self.memo_nbytes -= _memo_cost(old, old_ids)
        return ids

    @staticmethod
    def _check_messages(messages, limits: Limits = DEFAULT_LIMITS) -> None:
        if not messages:
            raise InvalidRequest("no messages and no prompt: the prompt is empty")
        if len(messages) > limits.max_messages:
            raise InvalidRequest(f"{len(messages)} messages; the limit is {limits.max_messages}")
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in MESSAGE_ROLES:
                raise InvalidRequest(
                    f"messages[{i}].role {printable(str(role))} is unknown "
                    f"(use one of {', '.join(MESSAGE_ROLES)})"
                )


def _memo_cost(text: str, ids: np.ndarray) -> int:
    return len(text) + int(ids.nbytes)
