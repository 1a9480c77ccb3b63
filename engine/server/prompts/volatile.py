"""Volatile lines: lines of a system prompt that change on every request, removed by rule.

A client that puts a per-request value in its system prompt (Claude Code's
billing header line, `x-anthropic-billing-header: ...; cch=<hash>;`) changes the
prompt's first tokens every turn, and no prefix cache can restore past them. The
rules (regular expressions, `--volatile-line`; engine.config.prompt) are applied to
the text of every system message before the chat template renders it: a line
that a rule matches (re.search) goes, with its line break. What the model sees
is the same prompt without those lines on every turn. It knows nothing of
tokens or of the cache.
"""

from __future__ import annotations

import re
from typing import Sequence


class VolatileLines:
    """The rules, compiled once; `apply` canonicalizes one request's messages."""

    def __init__(self, rules: Sequence[str] = ()):
        self.rules = tuple(re.compile(r) for r in rules)

    def apply(self, messages: Sequence[dict]) -> tuple[tuple[dict, ...], int]:
        """(messages with the matching lines of system text removed, lines removed).

        Only string contents of system messages are read; everything else is
        returned as it came (the same objects).
        """
        if not self.rules:
            return tuple(messages), 0
        out, removed = [], 0
        for m in messages:
            content = m.get("content")
            if m.get("role") == "system" and isinstance(content, str) and content:
                kept, n = self._lines(content)
                if n:
                    m, removed = {**m, "content": kept}, removed + n
            out.append(m)
        return tuple(out), removed

    def _lines(self, text: str) -> tuple[str, int]:
        lines = text.splitlines(keepends=True)
        kept = [
            line for line in lines if not any(r.search(line.rstrip("\r\n")) for r in self.rules)
        ]
        return "".join(kept), len(lines) - len(kept)
