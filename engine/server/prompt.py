"""Prompts from requests: validation, the chat template, the anchor boundary, the long messages.

The anchor is where (system messages + tools) ends and the first user message
begins: the chat template rendered on the leading system messages plus the
tools, without the generation prompt, tokenized once per distinct text
(memoized), and its common prefix with the prompt, minus a few tokens of slack
for BPE merges at the boundary (docs/architecture.md, "The cache contract").
The messages after it that may be longer than `message_min_tokens` are
located among the prompt's tokens (engine.server.message_spans), for the
cache's long-message points.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.server.errors import InvalidRequest
from engine.server.limits import DEFAULT_LIMITS, Limits, parse_json, printable
from engine.server.message_spans import candidates, char_spans, common_prefix, token_spans

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


@dataclass(frozen=True)
class Prompt:
    tokens: tuple[int, ...]
    anchor_len: int
    # Token spans (start, end) of the messages after the system block that may hold
    # long-message points (PlanRequest.message_spans).
    message_spans: tuple[tuple[int, int], ...] = ()


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


class PromptBuilder:
    """Turns a PromptInput into prompt tokens plus the anchor length."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        max_context: int,
        anchor_slack: int = 2,
        memo_size: int = 256,
        limits: Limits = DEFAULT_LIMITS,
        message_min_tokens: int = 0,
    ):
        """`message_min_tokens`: locate the messages that may be longer than this (the
        cache's `message_interval`); 0 locates none."""
        self.tokenizer = tokenizer
        self.message_min_tokens = message_min_tokens
        self.limits = limits
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.anchor_slack = anchor_slack
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._memo_size = memo_size
        self._memo_bytes = limits.max_memo_bytes  # text plus ids, over every memoized render
        self.memo_nbytes = 0

    def build(self, inp: PromptInput) -> Prompt:
        spans = ()
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
            messages = list(inp.messages)
            text = self.render(
                messages, inp.tools, inp.add_generation_prompt, inp.continue_final_message
            )
            head = _system_head(messages)
            system = self.render(head, inp.tools, False) if head or inp.tools else ""
            long = candidates(messages, len(head), self.message_min_tokens)
            offsets = self._offsets(text) if long else None
            if offsets is None:
                tokens = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            else:
                tokens, first_token_from = offsets
                located = char_spans(
                    text,
                    messages,
                    long,
                    common_prefix(system, text),
                    lambda prefix: self.render(prefix, inp.tools, False),
                )
                spans = token_spans(located, first_token_from, self.message_min_tokens)
            anchor = self.anchor_length(messages, inp.tools, tokens, system)
        if not tokens:
            raise InvalidRequest("the prompt is empty")
        if len(tokens) >= self.max_context:
            raise InvalidRequest(
                f"the prompt has {len(tokens)} tokens; the model's context is {self.max_context}"
            )
        return Prompt(tokens=tokens, anchor_len=anchor, message_spans=spans)

    def _offsets(self, text: str) -> tuple[tuple[int, ...], Callable[[int], int]] | None:
        """The prompt's token ids, from one tokenization (the fast tokenizer's own, as
        `encode` runs it), and the index of the first token that starts at or after a
        given character; None without a fast tokenizer."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        encoding = backend.encode(text, add_special_tokens=False)
        count = len(encoding.ids)

        def first_token_from(char: int) -> int:
            token, at = None, char
            while token is None and at < len(text):  # a character no token covers: the next
                token = encoding.char_to_token(at)
                at += 1
            if token is None:
                return count
            return token if encoding.token_to_chars(token)[0] >= char else token + 1

        return tuple(encoding.ids), first_token_from

    def render(
        self,
        messages: list,
        tools,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
    ) -> str:
        kwargs = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = list(tools)
        if continue_final_message:
            kwargs.update(add_generation_prompt=False, continue_final_message=True)
        try:
            if not messages:  # transformers refuses an empty conversation; render directly
                from transformers.utils.chat_template_utils import render_jinja_template

                kwargs.pop("tokenize")
                return render_jinja_template(
                    conversations=[messages], chat_template=self.tokenizer.chat_template, **kwargs
                )[0][0]
            return self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as e:  # a template error is the request's fault
            raise InvalidRequest(f"the chat template failed on these messages: {e}")

    def anchor_length(self, messages, tools, tokens, text: str | None = None) -> int:
        """Tokens the prompt shares with the render of its system messages plus tools
        (`text`, when the caller rendered it)."""
        head = _system_head(messages)
        if not head and not tools:
            return 0
        if len(head) == len(messages) and not tools:
            return 0  # nothing after the system block: no boundary to pin
        if text is None:
            text = self.render(head, tools, add_generation_prompt=False)
        prefix = self._tokens(text)
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


def _system_head(messages) -> list:
    """The leading system messages."""
    head = []
    for m in messages:
        if m.get("role") != "system":
            break
        head.append(m)
    return head


def _memo_cost(text: str, ids: np.ndarray) -> int:
    return len(text) + int(ids.nbytes)
