"""The prompt branch of the configuration: what the front end does to prompts and outputs.

Each operator setting is declared once here, beside its field (engine.config.declare).
It checks its own values: every volatile-line rule compiles and never matches an
empty line. engine/server applies them (engine.server.prompts.volatile and
.output_format).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.config.declare import label_of, setting

# Claude Code starts its system prompt with
# `x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=71fea;`,
# whose version suffix and cch hash change on every request: a prompt cache that takes
# the prompt as sent misses every turn from its first line on.
BILLING_HEADER = r"^x-anthropic-billing-header:"
VOLATILE_DEFAULTS = (BILLING_HEADER,)

# How a model marks reasoning and tool calls in its output (clients.bridge.parsers);
# -thinking: the chat template's generation prompt opens the reasoning block itself.
# The output families: clients.bridge.parsers reads this list (one declaration);
# `plain` last.
OUTPUT_FAMILIES = (
    "qwen",
    "qwen_xml",
    "glm",
    "kimi",
    "deepseek",
    "dsml",
    "llama3_json",
    "pythonic",
    "mistral",
    "harmony",
    "gemma4",
    "command_r",
    "command_r7b",
    "minimax",
    "nemotron",
    "granite",
    "phi4",
    "apertus",
    "apriel",
    "seed_oss",
    "gigachat3",
    "gigachat3_1",
    "lfm2",
    "solar_open",
    "plain",
)
OUTPUT_FORMATS = ("auto", *OUTPUT_FAMILIES, *(f"{f}-thinking" for f in OUTPUT_FAMILIES[:-1]))


def parse_regex(value) -> str:
    """A regular expression, checked to compile and not to match an empty line."""
    text = str(value)
    try:
        pattern = re.compile(text)
    except re.error as error:
        raise ValueError(f"{text!r} is not a regular expression ({error})") from None
    if pattern.search(""):
        raise ValueError(f"{text!r} matches an empty line: it would remove every line")
    return text


@dataclass(frozen=True)
class PromptConfig:
    """Prompts and outputs: volatile lines, the output format."""

    volatile_lines: tuple[str, ...] = setting(
        VOLATILE_DEFAULTS,
        "a line of a system message that this regular expression matches (re.search) is "
        "removed before tokenizing, so a value that changes every request keeps no prompt "
        "from the cache; repeat the flag for more rules, one a line in the variable; they "
        "add to the default",
        name="volatile_line",
        parse=parse_regex,
        repeat=True,
        metavar="REGEX",
        shown="Claude Code's billing header line (`^x-anthropic-billing-header:`)",
    )
    output_format: str = setting(
        "auto",
        "how the model marks reasoning and tool calls in its output: auto (from its chat "
        "template and tokenizer) or a family (docs/api.md, Output formats); -thinking after "
        "any but plain: the generation prompt opens the reasoning",
        choices=OUTPUT_FORMATS,
        metavar="auto|" + "|".join(OUTPUT_FAMILIES),
    )

    def __post_init__(self):
        for rule in self.volatile_lines:
            try:
                parse_regex(rule)
            except ValueError as error:
                raise ValueError(f"{label_of(PromptConfig, 'volatile_lines')}: {error}")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(
                f"{label_of(PromptConfig, 'output_format')}: {self.output_format!r} is not one "
                f"of {', '.join(OUTPUT_FORMATS)}"
            )
